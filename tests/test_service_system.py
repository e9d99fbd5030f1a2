"""The scheduler service for real: `malleable serve` processes on a real Dask cluster with gloo
training, a sqlite job store, MLflow; submitters, a failing job, a shrink in place, a cancel, and the CLI's clients of a running service (run, retrain, hpo run). A killed and restarted service is tests/test_service_restarts.py; a worker joining, tests/test_service_capacity.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from service.client import ServiceClient
from service.store import JobStore
from service.store.records import JobState
from tests.paced_recipe import ENTRY as PACED, PACE_FILE_ENV
from tests.service_process import PROFILE, REPO, entry, service_env, wait_until  # noqa: F401 - service_env is a fixture

pytestmark = pytest.mark.slow


def test_jobs_from_independent_submitters_share_the_cluster_shrink_in_place_fail_and_cancel(prefect_api_url, service_env):
    start, store_url, env, cwd = service_env
    pace = cwd / "pace"  # the paced jobs below are slow while it exists (tests/paced_recipe.py)
    pace.touch()
    env[PACE_FILE_ENV] = str(pace)
    svc = start()
    svc.wait_for_line("serving")
    store = JobStore(store_url)
    alice, bob = ServiceClient(store, submitter="alice"), ServiceClient(store, submitter="bob")

    broken = alice.submit(entry("broken", 1000, workload="no_such_module_xyz:recipe")).job_id
    failed = wait_until(lambda: (r := store.job(broken)).state is JobState.FAILED and r, 60, "the broken job to fail", store)
    assert "no_such_module_xyz" in failed.error

    # A second service on the same store refuses, before starting any cluster. (Before the first
    # job starts: a CLI's start-up inside the window that job must outlast would force it longer.)
    second = subprocess.run([sys.executable, "-m", "flows.commands.cli", "serve"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert "another malleable service" in second.stderr and "Traceback" not in second.stderr + second.stdout

    # Paced: still running when bob's job has started and been cancelled, whatever the box's speed
    # (paced, its samples last >= 100 s, each of the three waits below is bounded by 60 s); the
    # rest trains at full speed once the pace file is gone (seconds: the test waits for it).
    first = alice.submit(entry("first", 50_000, workload=PACED)).job_id
    wait_until(lambda: [(a.kind, a.gpus) for a in store.allocations(first)] == [("start", 2)], 60, "first on 2 GPUs", store)

    # Bob's job arrives: the first job shrinks in place to make room.
    other = bob.submit(entry("other", 1_000_000, workload=PACED)).job_id
    wait_until(lambda: store.allocations(other), 60, "other started", store)
    kinds = [(a.kind, a.gpus) for a in store.allocations(first)]
    assert kinds[:2] == [("start", 2), ("in_place", 1)], kinds
    assert store.job(other).gpus == 1

    # Cancel the running one: it stops, its GPU is freed, the first job may grow back.
    bob.cancel(other)
    wait_until(lambda: store.job(other).state is JobState.CANCELLED, 60, "other cancelled", store)
    pace.unlink()
    done = alice.wait([first], timeout_s=180)
    assert [r.state for r in done] == [JobState.FINISHED]
    assert done[0].samples_done == done[0].total_samples
    assert [r.state for r in store.jobs()] == [JobState.FAILED, JobState.FINISHED, JobState.CANCELLED]
    assert {r.submitter for r in store.jobs()} == {"alice", "bob"}

    # MLflow: one run per job, metrics logged while it trained (more than one timestamp).
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(f"sqlite:///{(cwd / 'state' / 'mlflow.db').resolve()}")
    run_id = store.job(first).mlflow_run_id
    assert run_id is not None
    gpus = [m.value for m in mlflow.get_metric_history(run_id, "gpus")]
    assert gpus[:2] == [2.0, 1.0]
    losses = mlflow.get_metric_history(run_id, "loss")
    assert len({m.timestamp for m in losses}) >= 2
    # The service's tracking thread ends the run after the store says FINISHED (its files first).
    wait_until(lambda: mlflow.get_run(run_id).info.status == "FINISHED", 60, "MLflow run FINISHED", store)

    # The clients below run flows: they record them in the session's Prefect API (no ephemeral API each).
    clients = {**env, "MALLEABLE_JOB_STORE": store_url, "PREFECT_API_URL": prefect_api_url}
    # `malleable run` with the store configured is a client of the running service, not a second scheduler.
    jobs_file = cwd / "tiny.yaml"
    jobs_file.write_text(yaml.safe_dump({"profiles": {"p": PROFILE}, "jobs": [{k: v for k, v in entry("tiny", 4_096).items() if k != "profile"} | {"profile": "p"}]}))
    run = subprocess.run(
        [sys.executable, "-m", "flows.commands.cli", "run", str(jobs_file)], cwd=cwd, env=clients, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "scheduled by the running service" in run.stdout
    tiny = [r for r in store.jobs() if r.name == "tiny"]
    assert [(r.state, r.submitter) for r in tiny] == [(JobState.FINISHED, "cluster-flow:tiny.yaml")]

    # So is `malleable retrain`: its job runs on the service's cluster; the model comes from its checkpoint.
    retrain = subprocess.run(
        [sys.executable, "-m", "flows.commands.cli", "retrain", "elastic_tasks.examples:mlp_tiny", "--epochs", "2"],
        cwd=cwd, env=clients, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert retrain.returncode == 0, retrain.stdout + retrain.stderr
    retrained = [r for r in store.jobs() if r.submitter == "retrain:elastic_tasks.examples:mlp_tiny"]
    assert [r.state for r in retrained] == [JobState.FINISHED]
    model_runs = [r for r in mlflow.search_runs([mlflow.get_experiment_by_name("malleable").experiment_id]) if r.data.tags.get("malleable.service_job") == retrained[0].id]
    assert len(model_runs) == 1 and any(a.path == "model" for a in mlflow.list_artifacts(model_runs[0].info.run_id))

    # And `malleable hpo run`: every trial of every stage is a job of the service, each stage
    # resumed from the previous stage's checkpoint (its first loss below that trial's first).
    hpo_file = cwd / "hpo.yaml"
    # The example's deadline is set for 4 workers; the service has 2.
    hpo_file.write_text(yaml.safe_dump(yaml.safe_load((REPO / "examples" / "hpo_tiny.yaml").read_text()) | {"deadline_s": 30}))
    hpo = subprocess.run(
        [sys.executable, "-m", "flows.commands.cli", "hpo", "run", str(hpo_file), "--workers", "2"],
        cwd=cwd, env=clients, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert hpo.returncode == 0, hpo.stdout + hpo.stderr
    trials = [r for r in store.jobs() if r.submitter == "hpo:mlp-tiny-sha4"]
    assert sorted(int(r.name.rsplit("-s", 1)[1]) for r in trials) == [0, 0, 0, 0, 1, 1, 2]
    assert {r.state for r in trials} == {JobState.FINISHED}
    assert all(r.steps == (20, 40, 80)[int(r.name.rsplit("-s", 1)[1])] and r.final_loss is not None for r in trials)
    by_name = {r.name: r for r in trials}
    for r in trials:
        trial, stage = r.name.removeprefix("mlp-tiny-sha4-t").split("-s")
        if stage != "0":
            assert r.first_loss < by_name[f"mlp-tiny-sha4-t{trial}-s0"].first_loss

    assert svc.stop() == 0
    assert "stopped" in svc.lines[-1]
