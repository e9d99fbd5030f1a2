"""retrain through its prefect.yaml deployment entry point, with MLflow down until it ends; and
retrain on a cluster at a scheduler address, profiling on its worker.

Training must complete while the tracking server is unreachable; the metrics and the model
buffered meanwhile must arrive once the server is up.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import stop
import yaml
from mlflow import MlflowClient

from tests.ports import unclaimed_port
from tests.test_tracking import _wait_healthy, server_env

ROOT = Path(__file__).resolve().parents[1]


def _deployment(name: str) -> dict:
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return next(d for d in project["deployments"] if d["name"] == name)


@pytest.mark.slow
def test_retrain_deployment_trains_while_mlflow_is_down_and_metrics_arrive_later(prefect_harness, tmp_path, monkeypatch):
    from prefect.flows import load_flow_from_entrypoint

    from flows.config.settings import load_settings
    from flows.recording.tracking import tracker_from_settings

    port = unclaimed_port()  # free until the server started later takes it
    url = f"http://127.0.0.1:{port}"
    monkeypatch.chdir(ROOT)  # the deployment's working directory
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MALLEABLE_TRACKING_URI", url)
    monkeypatch.setenv("MALLEABLE_WORKERS", "2")

    deployment = _deployment("nightly-retrain")
    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    # The deployment's parameters, on the fastest example model.
    params = {**deployment["parameters"], "entrypoint": "elastic_tasks.examples:mlp_tiny", "epochs": 1.0, "min_batch": 16, "max_batch": 128}
    flow.validate_parameters(params)
    state = flow(**params, return_state=True)
    assert state.is_completed(), state.message
    outcome = state.result()
    assert outcome.steps > 0 and outcome.eval_accuracy is not None and outcome.eval_accuracy > 0.5
    assert outcome.model_uri is None  # MLflow was down: nothing has a server-side id yet

    settings = load_settings()
    assert settings.buffer_path.exists()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=server_env(),
    )
    try:
        _wait_healthy(url, proc)
        tracker = tracker_from_settings(settings, notify=lambda _msg: None)
        assert tracker.flush()  # e.g. the next `malleable` command, or the next call of a live run
        client = MlflowClient(url)
        exp = client.get_experiment_by_name(settings.experiment)
        runs = client.search_runs([exp.experiment_id], "tags.`malleable.mode` = 'retrain'")
        assert len(runs) == 1
        run = runs[0]
        assert run.info.status == "FINISHED"
        assert run.data.params["entrypoint"] == "elastic_tasks.examples:mlp_tiny"
        loss = client.get_metric_history(run.info.run_id, "loss")
        assert len(loss) == outcome.steps
        assert run.data.metrics["eval_accuracy"] == pytest.approx(outcome.eval_accuracy)
        assert "model/MLmodel" in {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    finally:
        stop(proc)


def test_every_deployment_in_prefect_yaml_loads():
    from prefect.flows import load_flow_from_entrypoint

    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    names = {d["name"] for d in project["deployments"]}
    assert {"nightly-retrain", "cluster-run", "seed000-reproduction"} <= names
    for d in project["deployments"]:
        path, _, fn = d["entrypoint"].partition(":")
        assert (ROOT / path).is_file(), d["entrypoint"]
        flow = load_flow_from_entrypoint(str(ROOT / path) + ":" + fn)
        flow.validate_parameters(d.get("parameters", {}))  # every parameter exists and has the right type
        assert d["work_pool"]["name"] == "malleable-process"
    nightly = next(d for d in project["deployments"] if d["name"] == "nightly-retrain")
    from prefect.client.schemas.schedules import CronSchedule

    cron = CronSchedule(cron=nightly["schedules"][0]["cron"], timezone=nightly["schedules"][0]["timezone"])
    assert cron.cron == "0 2 * * *"
    cluster = next(d for d in project["deployments"] if d["name"] == "cluster-run")
    assert (ROOT / cluster["parameters"]["jobs_file"]).is_file()


@pytest.mark.slow
def test_retrain_on_a_cluster_profiles_on_its_worker_once(prefect_harness, tmp_path, monkeypatch):
    """The profile is measured where the ranks run (a GPU worker of the cluster, as a rank trains
    there), not in the flow's process, and a second retrain reuses it (keyed by that worker)."""
    from distributed import Client, LocalCluster

    from flows.retrain_flow import retrain_flow

    def computed(client: Client) -> dict[str, int]:
        return client.run_on_scheduler(lambda dask_scheduler: {p: tp.state_counts["memory"] for p, tp in dask_scheduler.task_prefixes.items()})

    with LocalCluster(n_workers=2, threads_per_worker=1, resources={"GPU": 1}, dashboard_address=None) as cluster, Client(cluster) as client:
        monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
        monkeypatch.setenv("MALLEABLE_CLUSTER", "address")
        monkeypatch.setenv("MALLEABLE_SCHEDULER_ADDRESS", cluster.scheduler_address)
        monkeypatch.setenv("MALLEABLE_WORKERS", "2")
        first = retrain_flow("elastic_tasks.examples:mlp_tiny", epochs=0.25, min_batch=16, max_batch=64, profile_batches=[8, 16])
        after_first = computed(client)
        assert after_first.get("profile_entry_point") == 1  # measured on a worker
        second = retrain_flow("elastic_tasks.examples:mlp_tiny", epochs=0.25, min_batch=16, max_batch=64, profile_batches=[8, 16])
        after_second = computed(client)
    assert first.steps > 0 and second.steps > 0
    assert after_second.get("profile_entry_point") == 1  # the second run's profile came from the cache
    assert after_second.get("worker_identity") == 2  # ... after asking the worker what it is

    tracking = MlflowClient(f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}")
    runs = tracking.search_runs([tracking.get_experiment_by_name("malleable").experiment_id], "tags.`malleable.mode` = 'retrain'")
    # Measured as a rank trains on that worker: its device and one torch thread.
    assert {r.data.params["hardware"].split("|threads=")[1].split("|")[0] for r in runs} == {"1"}
    # ... and kept in the state directory's profile cache, where a job submitted next (CLI or
    # Python client, without a profile) finds it instead of a neutral prior.
    from service.client import ServiceClient
    from service.jobs.priors import cached_profile

    cached = cached_profile(tmp_path / "state" / "profiles", "elastic_tasks.examples:mlp_tiny")
    assert cached is not None and cached.hardware in {r.data.params["hardware"] for r in runs}
    client = ServiceClient(f"sqlite:///{tmp_path / 'jobs.db'}", submitter="alice", profile_cache_dir=tmp_path / "state" / "profiles")
    entry = {"id": "next", "workload": "elastic_tasks.examples:mlp_tiny", "samples": 1000, "min_batch": 16, "max_batch": 64, "max_gpus": 2}
    assert client.job(client.submit(entry).job_id).spec["profile"]["hardware"] == cached.hardware
