"""End to end: the README's first command as a newcomer runs it — `malleable quickstart` (half the
samples) as a subprocess in a fresh directory, with a fresh Prefect home and without the CI's
telemetry settings — then its Prefect flow runs and MLflow runs, rescales included."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.recording.tracking import PARENT_TAG

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quickstart_as_a_newcomer_sees_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MALLEABLE_", "MLFLOW_", "DASK_"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), MALLEABLE_EXPERIMENT="quickstart-test", COLUMNS="80")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cli = Path(sys.executable).parent / "malleable"
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "flows.commands.cli"]
    done = subprocess.run([*command, "quickstart", "--scale", "0.5"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Traceback" not in output, output
    assert not [line for line in output.splitlines() if "ERROR" in line], output
    assert not [line for line in output.splitlines() if " | INFO " in line or "distributed." in line], output
    for needle in ("job-a", "job-b", "job-c", "in-place rescales", "mlflow ui --backend-store-uri", "prefect server start"):
        assert needle in done.stdout, output

    # The flow runs, as the ephemeral Prefect server stored them in the fresh home.
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        states = db.execute("SELECT flow.name, flow_run.state_type FROM flow_run JOIN flow ON flow.id = flow_run.flow_id").fetchall()
    assert {name for name, _ in states} >= {"quickstart", "profile", "cluster"}, states
    assert all(state == "COMPLETED" for _, state in states), states

    mlflow = MlflowClient(f"sqlite:///{tmp_path / '.malleable' / 'mlflow.db'}")
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
        assert 0.0 <= child.data.metrics["final_accuracy"] <= 1.0 and "accuracy" not in child.data.metrics
        assert "final_loss" in child.data.metrics  # the end value, outside the per-step "loss" series
        assert child.data.metrics["jct_s"] > 0
        losses = mlflow.get_metric_history(child.info.run_id, "loss")
        # Each step at the time it ran (not one timestamp for the lot), and the schedule on the
        # same clock: a job's first GPUs and its first step are moments apart, not a warm-up.
        assert len({m.timestamp for m in losses}) > 1
        assert abs(min(m.timestamp for m in gpus) - min(m.timestamp for m in losses)) < 5000
    # MLflow while it trained: the parent run opened before the first step, and rank 0's
    # reports were sampled into the job runs as the loop went.
    first_step_ms = min(m.timestamp for c in children for m in mlflow.get_metric_history(c.info.run_id, "loss"))
    assert parent.info.start_time <= first_step_ms
    assert sum(len(mlflow.get_metric_history(c.info.run_id, "live_loss")) for c in children) >= 1
    # At least one job changed size while it ran, in place.
    assert parent.data.metrics["rescales"] >= 1
    assert sum(c.data.metrics["rescales"] for c in children) >= 1
