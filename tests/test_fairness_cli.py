"""Teams through the commands: `malleable simulate --teams` (summary.json, --fair/--no-fair) and the
simulate flow's MLflow parent run (`malleable run --simulate --teams`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
JOBS, TEAMS = REPO / "examples" / "jobs-teams.yaml", REPO / "examples" / "teams.yaml"


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("MALLEABLE_TEAMS", raising=False)


def _simulate(tmp_path: Path, *extra: str) -> dict:
    from flows.commands.cli import app

    out = tmp_path / ("out" + "".join(extra))
    args = ["simulate", str(JOBS), "--teams", str(TEAMS), "-p", "goodput_dp", "--interval", "60", "--no-react", "--no-plots", "-o", str(out), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "teams under goodput_dp" in result.output
    return json.loads((out / "summary.json").read_text())["policies"]["goodput_dp"]


def test_simulate_with_teams_runs_the_policy_inside_their_shares_and_reports_each_teams_fairness(tmp_path):
    fair_run, plain = _simulate(tmp_path), _simulate(tmp_path, "--no-fair")
    assert fair_run["fairness"]["fair"] is True and plain["fairness"]["fair"] is False
    # examples/teams.yaml: 4 GPUs each; product's one job (up to 4 GPUs) arrives while research holds all 8.
    assert fair_run["fairness"]["teams"]["product"]["nominal_gpus"] == 4
    assert fair_run["fairness"]["teams"]["product"]["max_rho"] <= 1.1 < plain["fairness"]["teams"]["product"]["max_rho"]
    used = fair_run["fairness"]["submitters"]
    assert set(used) == {"alice", "bob", "erin", "retrain:nightly"} and used["erin"]["team"] == "product"


def test_a_bad_teams_file_is_one_line(tmp_path):
    from flows.commands.cli import app

    (tmp_path / "t.yaml").write_text("teams: {a: {quota: many}}\n")
    result = CliRunner().invoke(app, ["simulate", str(JOBS), "--teams", str(tmp_path / "t.yaml"), "--no-plots", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "teams.a.quota='many': must be an integer number of GPUs >= 0" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_the_simulate_flow_records_how_fair_the_run_was_on_its_parent_run(prefect_harness, tmp_path):
    from mlflow import MlflowClient

    from flows.config.settings import load_settings
    from flows.simulate_flow import simulate_flow

    outcome = simulate_flow(str(JOBS), policy="goodput_dp", interval_s=60.0, react=False, run_name="teams", teams_file=str(TEAMS))
    run = MlflowClient(load_settings().resolved_tracking_uri).get_run(outcome.recorded.parent_run)
    metrics = run.data.metrics
    assert run.data.params["teams_file"] == str(TEAMS) and run.data.params["policy"] == "goodput_dp+fair"
    assert metrics["team.product.nominal_gpus"] == 4 and metrics["team.product.max_rho"] <= 1.1
    assert {"fairness_max_rho", "fairness_jain", "team.research.used_gpu_h", "team.research.entitled_gpu_h", "submitter.erin.used_gpu_h"} <= set(metrics)
