"""Teams in the real service: `malleable serve --teams` on 4 Dask workers with gloo ranks.

Team A's job holds all 4 workers; team B's job arrives. B's quota (3) is given back by shrinking A
in place — not by a restart — and B's job runs within one decision interval of its arrival plus
the time the shrink and its ranks' start took; A grows back in place once B finishes. Without the
teams file the policy (elastic_dp) would split the cluster 2/2 between two such jobs."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from service.client import ServiceClient
from service.store import JobStore
from service.store.records import JobState
from tests.paced_recipe import ENTRY as PACED, PACE_FILE_ENV
from tests.service_process import entry, service_env, wait_until  # noqa: F401  (service_env is a fixture)

pytestmark = pytest.mark.slow
# The decision interval Δ: with MALLEABLE_REACT=false each step of the scenario (A's start, the
# shrink for B, the growth after B) waits for the next tick; 2 s keeps that wait short and still
# leaves ticks apart (a decision over two jobs takes milliseconds).
INTERVAL_S = 2.0
TEAMS = "teams:\n  a: {quota: 1, members: [alice]}\n  b: {quota: 3, members: [bob]}\n"


@pytest.mark.timeout(600)
def test_a_team_takes_its_quota_back_by_shrinking_the_borrower_in_place_and_the_borrower_grows_back(service_env):
    start, store_url, env, cwd = service_env
    (cwd / "teams.yaml").write_text(TEAMS)
    # Decisions only every Δ: the bound below is the interval's, not a reaction to the submission.
    env.update(MALLEABLE_WORKERS="4", MALLEABLE_INTERVAL_S=str(INTERVAL_S), MALLEABLE_REACT="false", MALLEABLE_TEAMS="teams.yaml")
    # A's job is paced throughout (tests/paced_recipe.py): it only has to run, and its ranks then
    # sleep rather than take the 2 cores from B's; paced, its steps scale with its GPUs as the
    # profile says, so the policy's growing back does not hinge on what 4 ranks measure on 2 cores.
    (cwd / "pace").touch()
    env[PACE_FILE_ENV] = str(cwd / "pace")
    svc = start()
    svc.wait_for_line("serving")
    assert "fair shares among 3 teams" in svc.output()
    store = JobStore(store_url)
    alice, bob = ServiceClient(store, submitter="alice"), ServiceClient(store, submitter="bob")

    a = alice.submit(entry("a", 5_000_000, max_gpus=4, workload=PACED)).job_id
    wait_until(lambda: [(r.kind, r.gpus) for r in store.allocations(a)] == [("start", 4)], 120, "a on all 4 workers", store)
    b = bob.submit(entry("b", 30_000, max_gpus=4)).job_id
    submitted = store.job(b).submitted_at
    wait_until(lambda: store.allocations(b), 120, "b started", store)
    assert [(r.kind, r.gpus) for r in store.allocations(a)] == [("start", 4), ("in_place", 1)]
    assert [(r.kind, r.gpus) for r in store.allocations(b)] == [("start", 3)]

    # When: one interval (plus the poll that reads the submission), then the shrink and the start.
    wait_until(lambda: store.job(a).mlflow_run_id and store.job(b).mlflow_run_id, 60, "both MLflow runs", store)
    # Only now: the service has made (migrated) its MLflow database. A client opened while it still
    # migrates runs the same migration beside it ("table ... already exists"; seen once in CI).
    mlflow = MlflowClient(f"sqlite:///{(cwd / 'state' / 'mlflow.db').resolve()}")
    def pauses(j):
        return [m.value for m in mlflow.get_metric_history(store.job(j).mlflow_run_id, "rescale_pause_s")]

    # Metrics reach MLflow through the service's tracking thread, after the store's rows.
    wait_until(lambda: len(pauses(a)) >= 2 and len(pauses(b)) >= 1, 60, "the rescale pauses in MLflow", store)
    pause = {j: pauses(j) for j in (a, b)}
    shrink_s, start_s = pause[a][1], pause[b][0]
    started = store.allocations(b)[0].time
    assert started - submitted <= INTERVAL_S + 0.2 + shrink_s + start_s + 2.0, (started - submitted, shrink_s, start_s)

    done = bob.wait([b], timeout_s=300)
    assert [r.state for r in done] == [JobState.FINISHED]
    # Grows back: how far is the policy's call on the steps a measured (the service refits each
    # job's throughput model; on a loaded 2-core box four gloo ranks can measure no faster than two).
    def regrown():
        return [r for r in store.allocations(a)[2:] if r.kind == "in_place" and r.gpus >= 2]

    wait_until(regrown, 120, "a growing back", store)
    grown = regrown()[0]
    assert grown.time >= done[0].finished_at - 1.0
    assert all(r.kind != "restart" for j in (a, b) for r in store.allocations(j))  # in place throughout

    store.request_cancel(a)
    wait_until(lambda: store.job(a).state is JobState.CANCELLED, 60, "a cancelled", store)
    assert svc.stop() == 0
