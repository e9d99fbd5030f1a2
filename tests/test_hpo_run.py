"""A real HPO run on CPU (seed 001 execution): the greedy plan's trials are jobs of a scheduler
service (embedded for the run) on a Dask LocalCluster; stages shrink, losers are stopped, MLflow
holds one nested run per trial with each stage's job run nested under it."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.hpo_flow import hpo_flow

TINY = Path(__file__).resolve().parents[1] / "examples" / "hpo_tiny.yaml"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MALLEABLE_EXPERIMENT", "hpo-test")
    return tmp_path / "state"


@pytest.mark.slow
def test_real_hpo_run_shrinks_stops_losers_and_logs_nested_runs(prefect_harness, state: Path) -> None:
    result = hpo_flow(str(TINY), workers=4, timeout_s=300)

    # Stages shrink: trials 4 -> 2 -> 1, and the plan gives fewer GPUs at the end than at the start.
    assert [len(s.trials) for s in result.stages] == [4, 2, 1]
    gpus = [s.layout.gpus for s in result.stages]
    assert gpus == sorted(gpus, reverse=True) and gpus[-1] < gpus[0]

    # Losers are stopped: only the kept trials run in the next stage, each for exactly its steps.
    for before, after in zip(result.stages, result.stages[1:]):
        assert after.trials == before.kept
        assert set(before.trials) - set(before.kept)
    for run in result.runs:
        assert run.steps == (20, 40, 80)[run.stage]
    assert sorted(result.stopped_after(k) for k in range(4)) == [0, 0, 1, 2]

    # Survivors resume from their checkpoint: a trial's first loss in stage 1 is below its first in stage 0.
    for k in result.stages[1].trials:
        first = {r.stage: r.first_loss for r in result.runs if r.trial == k}
        assert first[1] < first[0]

    # Ranking really used the measured scores.
    stage0 = sorted((r for r in result.runs if r.stage == 0), key=lambda r: r.score)
    assert set(result.stages[0].kept) == {r.trial for r in stage0[:2]}

    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    parent = client.get_run(result.run)
    assert parent.data.metrics["actual_jct_s"] == pytest.approx(result.actual_jct_s)
    assert parent.data.metrics["predicted_jct_s"] == pytest.approx(result.prediction.jct_s)
    assert "actual_cost" in parent.data.metrics and "predicted_cost" in parent.data.metrics
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{result.run}'")
    assert len(children) == 4
    for child in children:
        assert "lr" in child.data.params
        history = client.get_metric_history(child.info.run_id, "gpus")
        assert len(history) == int(child.data.tags["stopped_after_stage"]) + 1
        assert client.get_metric_history(child.info.run_id, "train_loss")
        # Each of the trial's stage jobs has its own run (the service's, with live metrics) nested under it.
        jobs = client.search_runs([parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{child.info.run_id}'")
        assert len(jobs) == int(child.data.tags["stopped_after_stage"]) + 1
        assert {j.info.status for j in jobs} == {"FINISHED"}


@pytest.mark.slow
def test_hpo_run_cut_short_leaves_no_run_running(prefect_harness, state: Path) -> None:
    """A stage past its timeout: the flow fails, and its parent and trial runs end FAILED in MLflow."""
    with pytest.raises(TimeoutError):
        hpo_flow(str(TINY), workers=4, timeout_s=0.2)
    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("hpo-test").experiment_id])
    flow_runs = [r for r in runs if r.data.tags.get("malleable.kind") not in ("service-job", "service")]  # the embedded service's own
    assert len(flow_runs) == 5  # the parent and the 4 trials of stage 0
    assert {r.info.status for r in flow_runs} == {"FAILED"}
    # The stage's jobs were cancelled, not left to train: none of their runs is still RUNNING.
    assert "RUNNING" not in {r.info.status for r in runs}
