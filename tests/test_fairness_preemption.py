"""Teams in the real service where shrinking cannot return a quota: `malleable serve --teams` on 2
Dask workers with gloo ranks; a borrower's one-GPU job is preempted, saves a checkpoint as it
stops and resumes from it. (The in-place case is tests/test_fairness_system.py: a file each, so
that a parallel run starts them side by side.)"""

from __future__ import annotations

import pytest

from service.client import ServiceClient
from service.store import JobStore
from service.store.records import JobState
from tests.paced_recipe import ENTRY as PACED, PACE_FILE_ENV
from tests.service_process import entry, service_env, wait_until  # noqa: F401  (service_env is a fixture)

pytestmark = pytest.mark.slow
INTERVAL_S = 5.0


@pytest.mark.timeout(600)
def test_where_shrinking_cannot_return_a_quota_a_borrowers_job_stops_from_a_checkpoint_and_resumes_there(service_env):
    """Team A runs two one-GPU jobs on both workers (its quota is 1); B's job needs its GPU back and
    A's jobs cannot shrink below one GPU: one of them is preempted (which one: the simulated tests).
    It saves a checkpoint as it stops (periodic checkpoints are off here), goes back to the queue,
    and when B's job ends it resumes from that checkpoint rather than from the start."""
    start, store_url, env, cwd = service_env
    (cwd / "teams.yaml").write_text("teams:\n  a: {quota: 1, members: [alice]}\n  b: {quota: 1, members: [bob]}\n")
    env.update(MALLEABLE_WORKERS="2", MALLEABLE_INTERVAL_S=str(INTERVAL_S), MALLEABLE_TEAMS="teams.yaml", MALLEABLE_CHECKPOINT_EVERY="1000000")
    pace = cwd / "pace"  # A's jobs are paced from B's arrival on (tests/paced_recipe.py)
    env[PACE_FILE_ENV] = str(pace)
    svc = start()
    svc.wait_for_line("serving")
    store = JobStore(store_url)
    alice, bob = ServiceClient(store, submitter="alice"), ServiceClient(store, submitter="bob")
    mine = [alice.submit(entry(name, 5_000_000, max_gpus=1, workload=PACED)).job_id for name in ("a1", "a2")]
    wait_until(lambda: all(store.allocations(j) for j in mine), 120, "both of A's jobs on a worker each", store)
    # Far more than a restart from zero would redo between the resume and its first report: paced
    # from here on (64 samples a 0.26 s step), that is under 1,000 samples.
    wait_until(lambda: min(store.job(j).samples_done for j in mine) >= 20_000, 180, "progress before the preemption", store)
    pace.touch()  # the survivor's ranks sleep while B's job trains; the victim resumes paced
    b = bob.submit(entry("b", 20_000, max_gpus=1)).job_id
    wait_until(lambda: store.allocations(b), 120, "b started", store)
    kinds = {j: [(r.kind, r.gpus) for r in store.allocations(j)] for j in mine}
    assert sorted(kinds.values()) == [[("start", 1)], [("start", 1), ("stop", 0)]], kinds
    victim = next(j for j in mine if len(kinds[j]) == 2)
    assert store.job(victim).state is JobState.QUEUED
    stopped_at = store.job(victim).samples_done

    assert [r.state for r in bob.wait([b], timeout_s=300)] == [JobState.FINISHED]
    resumed = wait_until(lambda: (r := store.job(victim)).attempts == 2 and r.state is JobState.RUNNING and r, 120, "the preempted job resumed", store)
    # Its allocation row is written once its ranks have started.
    wait_until(lambda: [(r.kind, r.gpus) for r in store.allocations(victim)] == [("start", 1), ("stop", 0), ("start", 1)], 120, "its start row", store)

    def progress_after_resume() -> float:
        row = store.job(victim)
        return row.samples_done if row.updated_at > resumed.started_at + 1.5 else 0.0

    # From the checkpoint the stop saved: not from zero (nothing else was saved).
    assert wait_until(progress_after_resume, 120, "progress after the resume", store) >= 0.9 * stopped_at
    for j in mine:
        store.request_cancel(j)
    wait_until(lambda: all(store.job(j).state is JobState.CANCELLED for j in mine), 60, "cancelled", store)
    assert svc.stop() == 0
