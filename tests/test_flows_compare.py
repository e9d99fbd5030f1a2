"""The simulate flow recorded in MLflow, and ``malleable compare`` on two recorded runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from flows.recording.tracking import PARENT_TAG


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    """MLflow puts artifacts of experiments made without a location in ./mlruns: keep the
    checkout clean by running each test in its own directory."""
    monkeypatch.chdir(tmp_path)


JOBS = Path(__file__).parent / "data" / "flows_jobs.yaml"


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MALLEABLE_EXPERIMENT", "compare-test")
    return tmp_path


@pytest.mark.slow
def test_simulate_flow_records_parent_nested_runs_and_compare_puts_them_side_by_side(prefect_harness, state):
    from flows.commands.cli import app
    from flows.config.settings import load_settings
    from flows.simulate_flow import simulate_flow

    elastic = simulate_flow(str(JOBS), policy="elastic_dp", interval_s=5.0, run_name="elastic")
    fixed = simulate_flow(str(JOBS), policy="fixed_batch", interval_s=5.0, run_name="fixed")

    client = MlflowClient(load_settings().resolved_tracking_uri)
    parent = client.get_run(elastic.recorded.parent_run)
    assert parent.data.params["policy"] == "elastic_dp" and parent.data.params["mode"] == "simulated"
    children = {c.info.run_name: c for c in client.search_runs([parent.info.experiment_id], f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")}
    assert set(children) == {"a", "b", "c"}
    gpus = client.get_metric_history(children["a"].info.run_id, "gpus")
    assert gpus and all(1 <= m.value <= 4 for m in gpus[:-1]) and gpus[-1].value == 0  # schedule ends when the job does
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"schedule.csv", "figures"}
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "figures")} == {"figures/gpus-per-job.png", "figures/batch-per-job.png", "figures/jobs-completed.png"}

    png = state / "cmp.png"
    result = CliRunner().invoke(app, ["compare", elastic.recorded.parent_run, fixed.recorded.parent_run, "--out", str(png)])
    assert result.exit_code == 0, result.output
    assert "elastic" in result.output and "fixed" in result.output and "fixed_batch" in result.output
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # elastic_dp gives the first job the whole idle cluster, fixed_batch one GPU: different JCTs.
    assert elastic.recorded.metrics.avg_jct_s < fixed.recorded.metrics.avg_jct_s

    latest = CliRunner().invoke(app, ["compare", "--last", "2", "--out", str(png)])
    assert latest.exit_code == 0 and "elastic" in latest.output and "fixed" in latest.output
    # --out without a suffix: matplotlib writes NAME.png, and that is the name printed.
    bare = state / "cmp-bare"
    named = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["compare", "--last", "2", "--out", str(bare)])
    assert named.exit_code == 0 and f"{bare}.png" in named.output and Path(f"{bare}.png").is_file() and not bare.exists()


def test_compare_unknown_run_is_one_line(state):
    from flows.commands.cli import app
    from flows.recording.tracking import Tracker
    from flows.config.settings import load_settings

    s = load_settings()
    Tracker(s.resolved_tracking_uri, s.experiment, s.buffer_path).start_run("seed")  # the experiment exists
    result = CliRunner().invoke(app, ["compare", "deadbeef"])
    assert result.exit_code == 1
    assert "run='deadbeef': no such run" in result.output and "Traceback" not in result.output
