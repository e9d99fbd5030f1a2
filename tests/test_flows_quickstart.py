"""End to end: the quickstart (half the samples) through the CLI — Prefect flow run, MLflow runs, rescales."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from flows.tracking import PARENT_TAG


@pytest.mark.slow
def test_quickstart_end_to_end(prefect_harness, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    from flows.cli import app
    from flows.settings import load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MALLEABLE_EXPERIMENT", "quickstart-test")

    result = CliRunner().invoke(app, ["quickstart", "--scale", "0.5"])
    assert result.exit_code == 0, result.output
    for needle in ("job-a", "job-b", "job-c", "in-place rescales", "mlflow ui --backend-store-uri", "prefect server start"):
        assert needle in result.output

    with get_client(sync_client=True) as client:
        # The sync client sends sort=None unless given, which this server version rejects (422).
        newest = {"sort": FlowRunSort.START_TIME_DESC, "limit": 10}
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["quickstart"])), **newest)
        assert runs and all(r.state is not None and r.state.is_completed() for r in runs)
        cluster_runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["cluster"])), **newest)
        assert cluster_runs and cluster_runs[0].state.is_completed()

    settings = load_settings()
    mlflow = MlflowClient(settings.resolved_tracking_uri)
    exp = mlflow.get_experiment_by_name("quickstart-test")
    parents = [r for r in mlflow.search_runs([exp.experiment_id], "attributes.run_name = 'quickstart'")]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.params["mode"] == "real" and parent.data.params["policy"] == "elastic_dp"
    assert parent.info.status == "FINISHED"
    assert {a.path for a in mlflow.list_artifacts(parent.info.run_id)} >= {"schedule.csv", "figures"}
    assert mlflow.get_metric_history(parent.info.run_id, "jobs_completed")[-1].value == 3

    children = mlflow.search_runs([exp.experiment_id], f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    assert sorted(c.info.run_name for c in children) == ["job-a", "job-b", "job-c"]
    for child in children:
        gpus = mlflow.get_metric_history(child.info.run_id, "gpus")
        assert any(m.value >= 1 for m in gpus)  # the schedule as metrics over time
        assert mlflow.get_metric_history(child.info.run_id, "loss")  # measured by the trainer
        assert 0.0 <= child.data.metrics["accuracy"] <= 1.0
        assert child.data.metrics["jct_s"] > 0
    # At least one job changed size while it ran, in place.
    assert parent.data.metrics["rescales"] >= 1
    assert sum(c.data.metrics["rescales"] for c in children) >= 1
