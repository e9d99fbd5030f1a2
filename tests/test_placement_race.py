"""Placement never fails a job (real Dask workers, gloo, the tiny MLP; marked slow).

The race, forced rather than waited for: a job whose ranks have finished still holds every
worker (its completion not yet collected) when the plan made before that was seen shrinks it
and starts a new job. The shrink is skipped (the job is ending) and the start finds no free
worker — it used to fail the new job for good (``gpus=1: only 0 free GPU worker(s)``). Now the
start collects the finished job and takes its workers; a start that still finds too few waits,
planned, until a later ``apply`` finds them.
"""

from __future__ import annotations

import time

import pytest
from distributed import Client

from allocator.loop.execution import waiting_starts
from allocator.types import Allocation, RescaleKind, Share
from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import warm_up
from elastic_tasks.executor import DaskExecutor, JobSettings
from tests.factories import make_job, make_profile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"
PROFILE = make_profile("mlp", num_params=6_500, cap=128)


@pytest.fixture(scope="module")
def client():
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
