"""Placement never fails a job (real Dask workers, gloo, the tiny MLP; marked slow).

The race, forced rather than waited for: a job whose ranks have finished still holds every
worker (its completion not yet collected) when the plan made before that was seen shrinks it
and starts a new job. The shrink is skipped (the job is ending) and the start finds no free
worker — it used to fail the new job for good (``gpus=1: only 0 free GPU worker(s)``). Now the
start collects the finished job and takes its workers; a start that still finds too few waits,
planned, until a later ``apply`` finds them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from distributed import Client

from allocator.loop.execution import waiting_starts
from allocator.types import Allocation, RescaleKind, Share
from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import warm_up
from elastic_tasks.executor import DaskExecutor, JobSettings
from tests.factories import make_job, make_profile
from tests.paced_recipe import ENTRY as PACED, PACE_FILE_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"
PROFILE = make_profile("mlp", num_params=6_500, cap=128)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    # The workers' environment names a pace file (tests/paced_recipe.py): a test holds it while
    # its paced job must keep running, whatever the box's speed.
    with pytest.MonkeyPatch.context() as env:
        env.setenv(PACE_FILE_ENV, str(tmp_path_factory.mktemp("pace") / "pace"))
        with local_gpu_cluster(2) as cluster, Client(cluster) as c:
            warm_up(c, ENTRY)
            yield c


def _executor(client) -> DaskExecutor:
    client.wait_for_workers(2, timeout=60)
    return DaskExecutor(client, {"mlp": ENTRY}, JobSettings(timeout_s=20.0, poll_s=0.05), refit=None)


def _until(predicate, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"  # a hang check, not a timing assertion
        time.sleep(0.05)


def _run_out(executor: DaskExecutor, job_ids: set[str]) -> set[str]:
    """Poll as the loop does until every job in ``job_ids`` completed; the ones reported."""
    done: set[str] = set()

    def poll() -> bool:
        assert executor.failed(time.monotonic()) == []
        done.update(executor.completed(time.monotonic()))
        return job_ids <= done

    _until(poll)
    return done


def test_a_start_takes_the_workers_of_a_job_that_finished_but_still_holds_them(client):
    a = make_job("a", PROFILE, workload="mlp", total_samples=640, min_batch=32, max_batch=64, max_gpus=2)
    b = make_job("b", PROFILE, workload="mlp", total_samples=960, min_batch=32, max_batch=64, max_gpus=2)
    specs = {"a": a, "b": b}
    executor = _executor(client)
    both = Allocation((("a", Share(2, 64)),))
    executor.apply(0.0, Allocation(), both, specs)
    job_a = executor.jobs["a"]
    _until(lambda: job_a.finished)
    # The race: a's ranks are done, its completion not collected, and it holds both workers.
    assert sorted(executor.pool.busy.values()) == ["a", "a"] and executor.pool.free() == []

    planned = Allocation((("a", Share(1, 32)), ("b", Share(1, 32))))  # decided before a's end was seen
    events = executor.apply(1.0, both, planned, specs)

    assert executor.failed(1.0) == []
    assert [(e.job_id, e.kind) for e in events] == [("b", RescaleKind.START)]
    assert executor.jobs["b"].world_size == 1 and waiting_starts(executor, 1.0) == ()
    assert _run_out(executor, {"a", "b"}) == {"a", "b"}
    assert executor.results["a"].finished and executor.results["a"].samples_seen >= 640
    assert executor.results["b"].finished and executor.results["b"].samples_seen >= 960
    assert not executor.pool.busy


def test_a_start_that_finds_too_few_free_workers_waits_until_a_later_apply_finds_them(client):
    """A plan that counted on a worker still held by a running job: the start waits, planned (not
    failed); the loop decides again while it waits; once the holder stops, the same plan starts it."""
    a = make_job("a", PROFILE, workload="mlp", total_samples=10_000_000, min_batch=32, max_batch=64, max_gpus=2)
    b = make_job("b", PROFILE, workload="mlp", total_samples=960, min_batch=32, max_batch=64, max_gpus=2)
    specs = {"a": a, "b": b}
    executor = _executor(client)
    alone = Allocation((("a", Share(2, 64)),))
    executor.apply(0.0, Allocation(), alone, specs)
    _until(lambda: (s := executor.jobs["a"].status()) is not None and s.step >= 2)

    stale = Allocation((("a", Share(2, 64)), ("b", Share(1, 32))))
    assert executor.apply(1.0, alone, stale, specs) == []
    assert executor.failed(1.0) == [] and waiting_starts(executor, 1.0) == ("b",)
    assert "b" not in executor.jobs and executor.next_completion(1.0) is not None  # the loop keeps polling

    # a leaves; b's share is unchanged, so only the retry can start it.
    after = Allocation((("b", Share(1, 32)),))
    events = executor.apply(2.0, stale, after, specs)
    assert [(e.job_id, e.kind) for e in events] == [("a", RescaleKind.STOP), ("b", RescaleKind.START)]
    assert waiting_starts(executor, 2.0) == ()
    assert _run_out(executor, {"b"}) == {"b"}
    assert executor.results["b"].finished and executor.results["b"].samples_seen >= 960
    assert not executor.pool.busy


def test_a_job_stopped_and_started_again_resumes_and_its_end_is_reported(client, tmp_path):
    """A policy that takes a running job's GPUs away and gives them back later: the job resumes
    from the checkpoint its stop left, and its completion is reported (the executor used to keep
    it marked as reported from the stop, so the loop never heard it end)."""
    # Paced while the stop lands (it is published once step 5 is seen and read at a step boundary
    # later): unpaced, a fast box ran 480 of 600 steps, or all of them, before the stop took effect.
    # The resumed run is unpaced and trains what is left in seconds.
    pace = Path(os.environ[PACE_FILE_ENV])
    pace.touch()
    a = make_job("a", PROFILE, workload="mlp", total_samples=32 * 600, min_batch=32, max_batch=32, max_gpus=1)
    executor = DaskExecutor(client, {"mlp": PACED}, JobSettings(timeout_s=20.0, poll_s=0.05, checkpoint_root=str(tmp_path), checkpoint_every=5), refit=None)
    running = Allocation((("a", Share(1, 32)),))
    executor.apply(0.0, Allocation(), running, {"a": a})
    _until(lambda: (s := executor.jobs["a"].status()) is not None and s.step >= 5)
    (stop,) = executor.apply(1.0, running, Allocation(), {"a": a})
    pace.unlink()
    trained_before = executor.progress("a", 1.0)
    assert stop.kind == RescaleKind.STOP and 0 < trained_before < a.total_samples
    assert executor.completed(1.0) == [] and executor.next_completion(1.0) is None  # nothing runs
    (start,) = executor.apply(2.0, Allocation(), running, {"a": a})
    assert start.kind == RescaleKind.START
    assert executor.progress("a", 2.0) >= trained_before  # not back to zero while the new ranks start
    assert _run_out(executor, {"a"}) == {"a"}
    result = executor.results["a"]
    # Resumed, not started over: the second run's ranks began at a checkpoint of the first.
    assert result.samples_seen == a.total_samples and min(h.step for h in result.history) > 0


def test_a_grow_that_finds_too_few_free_workers_waits_and_the_job_trains_on(client):
    """A plan that grows a job onto a worker another job still holds: the job trains on at its
    size (it used to fail for good: ``gpus=1: only 0 free GPU worker(s)``), the loop is asked to
    decide again, and once the holder stops, the same plan grows it in place."""
    a = make_job("a", PROFILE, workload="mlp", total_samples=10_000_000, min_batch=32, max_batch=64, max_gpus=2)
    b = make_job("b", PROFILE, workload="mlp", total_samples=10_000_000, min_batch=32, max_batch=64, max_gpus=2)
    specs = {"a": a, "b": b}
    executor = _executor(client)
    side_by_side = Allocation((("a", Share(1, 32)), ("b", Share(1, 32))))
    executor.apply(0.0, Allocation(), side_by_side, specs)
    _until(lambda: all((s := executor.jobs[j].status()) is not None and s.step >= 2 for j in "ab"))

    stale = Allocation((("a", Share(2, 64)), ("b", Share(1, 32))))  # counted on b's worker
    assert executor.apply(1.0, side_by_side, stale, specs) == []
    assert executor.failed(1.0) == [] and waiting_starts(executor, 1.0) == ("a",)
    assert executor.jobs["a"].world_size == 1
    assert executor.in_effect(stale).get("a").gpus == 1  # the loop can see what a really holds
    step_then = executor.jobs["a"].status().step
    _until(lambda: executor.jobs["a"].status().step > step_then)  # a trains on

    # b leaves; a's share is unchanged, so only the retry can grow it.
    after = Allocation((("a", Share(2, 64)),))
    events = executor.apply(2.0, stale, after, specs)
    assert [(e.job_id, e.kind) for e in events] == [("b", RescaleKind.STOP), ("a", RescaleKind.IN_PLACE)]
    assert executor.jobs["a"].world_size == 2 and waiting_starts(executor, 2.0) == ()
    assert executor.failed(2.0) == []
    executor.apply(3.0, after, Allocation(), specs)
    assert not executor.pool.busy
