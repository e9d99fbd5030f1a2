"""MLflow tracking: parent and nested runs, batched metrics, artifacts; buffering while unreachable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests
import torch
from mlflow import MlflowClient

from flows.recording.tracking import PARENT_TAG, MetricPoint, Tracker
from tests.ports import unclaimed_port


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    """MLflow puts artifacts of experiments made without a location in ./mlruns: keep the
    checkout clean by running each test in its own directory."""
    monkeypatch.chdir(tmp_path)


def test_parent_nested_metrics_and_artifacts_on_sqlite(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    told: list[str] = []
    t = Tracker(uri, "exp", tmp_path / "buffer.jsonl", notify=told.append)
    parent = t.start_run("cluster", params={"policy": "elastic_dp", "capacity": 4})
    child = t.start_run("job-a", parent=parent, params={"max_gpus": 2})
    t.log_metrics(child, [MetricPoint("gpus", g, step) for step, g in enumerate([1, 2, 2, 1])])
    csv = tmp_path / "schedule.csv"
    csv.write_text("time,job,gpus,batch\n0,a,1,32\n")
    t.log_artifact(parent, csv)
    t.log_text(parent, "# summary\n", "summary.md")
    t.end_run(child)
    t.end_run(parent)

    client = MlflowClient(uri)
    assert client.get_run(child).data.tags[PARENT_TAG] == parent
    assert client.get_run(parent).data.params == {"policy": "elastic_dp", "capacity": "4"}
    history = client.get_metric_history(child, "gpus")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(0, 1), (1, 2), (2, 2), (3, 1)]
    assert {a.path for a in client.list_artifacts(parent)} == {"schedule.csv", "summary.md"}
    assert client.get_run(parent).info.status == "FINISHED"
    assert not t.offline and told == []


# MLflow 3's server starts a job runner beside it by default: 8 more processes (7 huey consumers),
# each importing mlflow, for GenAI jobs no test here runs. Tracking is all these servers serve.
def server_env() -> dict[str, str]:
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}")
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError("mlflow server did not come up")


@pytest.mark.slow
def test_unreachable_server_training_goes_on_and_metrics_arrive_later(tmp_path):
    port = unclaimed_port()  # free until the server started later takes it
    url = f"http://127.0.0.1:{port}"
    told: list[str] = []
    t = Tracker(url, "offline-exp", tmp_path / "buffer.jsonl", retry_every_s=0.0, notify=told.append)

    # A real (tiny) training loop that logs every step while nobody is listening.
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x @ torch.randn(8, 1)).squeeze(1)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = t.start_run("train", params={"lr": 0.1})
    losses = []
    for step in range(30):
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        t.log_metrics(run, [MetricPoint("loss", loss.item(), step)])
    model_file = tmp_path / "model.pt"
    torch.save(model.state_dict(), model_file)
    t.log_artifact(run, model_file, "model")
    t.end_run(run)

    assert losses[-1] < 0.1 * losses[0]  # training completed, undisturbed
    assert t.offline and run.startswith("offline-")
    assert len(told) == 1 and "unreachable" in told[0]  # told once, not per call
    assert t.run_id(run) is None

    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--allowed-hosts", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,  # its uvicorn: one group to stop
        env=server_env(),
    )
    try:
        _wait_healthy(url, proc)
        # The same server by another name: its /health passes, every API call is refused (403).
        other_name = f"http://localhost:{port}"
        refused: list[str] = []
        r = Tracker(other_name, "refused-exp", tmp_path / "refused.jsonl", notify=refused.append)
        r.log_metrics(r.start_run("refused"), [MetricPoint("loss", 1.0, 0)])
        assert r.offline and len(refused) == 1, refused
        assert "MALLEABLE_TRACKING_URI" in refused[0] and "--allowed-hosts" in refused[0] and f"localhost:{port}" in refused[0]

        assert t.flush()
        assert not t.offline
        run_id = t.run_id(run)
        assert run_id is not None
        client = MlflowClient(url)
        history = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)
        assert [m.step for m in history] == list(range(30))
        assert history[-1].value == pytest.approx(losses[-1])
        assert client.get_run(run_id).info.status == "FINISHED"
        assert [a.path for a in client.list_artifacts(run_id, "model")] == ["model/model.pt"]
        assert "reachable again" in told[-1]
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the server and the processes it started (mlflow 3's server can outlive a SIGTERM)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass


def test_embedded_store_keeps_artifacts_in_the_state_directory(tmp_path, monkeypatch):
    from flows.config.settings import Settings
    from flows.recording.tracking import tracker_from_settings

    monkeypatch.chdir(tmp_path)  # mlflow's own default would be ./mlruns here
    state = tmp_path / "state"
    t = tracker_from_settings(Settings(state_dir=state))
    run = t.start_run("cluster")
    t.log_text(run, "hello\n", "note.md")
    t.end_run(run)
    assert list(state.glob("mlartifacts/*/artifacts/note.md"))
    assert not (tmp_path / "mlruns").exists()


def test_a_flow_whose_store_goes_away_journals_like_the_service_and_replays(tmp_path):
    """One failure policy for flows and service: a local store whose directory is taken away mid-run
    (sqlite cannot open it: an OperationalError, which the flows' tracker used to raise into the
    flow) is journaled and sent, in order, once the store is back."""
    store_dir = tmp_path / "mlflow"
    store_dir.mkdir()
    uri = f"sqlite:///{store_dir / 'mlflow.db'}"
    told: list[str] = []
    t = Tracker(uri, "exp", tmp_path / "buffer.jsonl", notify=told.append, retry_every_s=0.0)
    run = t.start_run("job-a", params={"max_gpus": 2})
    t.log_metrics(run, [MetricPoint("loss", 3.0, 0)])
    aside = store_dir.with_name("mlflow.aside")
    store_dir.rename(aside)
    store_dir.write_text("not a directory")  # the store's directory is a file now: nothing opens it
    t.log_metrics(run, [MetricPoint("loss", 2.0, 1)])  # must not raise into the flow
    t.log_metrics(run, [MetricPoint("loss", 1.5, 2)])
    assert (tmp_path / "buffer.jsonl").stat().st_size > 0 and told, told
    store_dir.unlink()
    aside.rename(store_dir)
    t.end_run(run)
    assert t.flush() and not t.offline

    client = MlflowClient(uri)
    (only,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert sorted((m.step, m.value) for m in client.get_metric_history(only.info.run_id, "loss")) == [(0, 3.0), (1, 2.0), (2, 1.5)]
    assert only.info.status == "FINISHED"
