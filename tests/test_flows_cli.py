"""CLI bad inputs for the product commands: one red line, exit 2, no traceback, no flow started."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.commands.cli import app

GOOD = """
gpus: 2
profiles:
  p: {workload: mlp_tiny, num_params: 6532, batch_sizes: [8, 16], iter_times_s: [0.001, 0.002], max_batch_per_gpu: 64,
      allreduce: {latency_s: 0.001, seconds_per_param: 1.0e-8}}
jobs:
  - {id: a, profile: p, samples: 512, min_batch: 16, max_batch: 64, max_gpus: 2}
"""


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))


def _one_line_error(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for needle in needles:
        assert needle in result.output, result.output


def test_run_missing_jobs_file(tmp_path):
    _one_line_error(CliRunner().invoke(app, ["run", str(tmp_path / "nope.yaml")]), 2, "no such file")


def test_run_bad_jobs_file_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("max_gpus: 2}", "max_gpus: 2, speed: 3}"))
    _one_line_error(CliRunner().invoke(app, ["run", str(bad)]), 2, "speed", "unknown field")


def test_run_workload_that_is_not_trainable(tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(GOOD.replace("max_gpus: 2}", "max_gpus: 2, workload: resnet9000}"))
    _one_line_error(CliRunner().invoke(app, ["run", str(jobs)]), 2, "workload='resnet9000'")


def test_run_unknown_policy(tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(GOOD)
    _one_line_error(CliRunner().invoke(app, ["run", str(jobs), "--policy", "magic"]), 2, "policy='magic'", "elastic_dp")


@pytest.mark.parametrize("command", [["run", "jobs.yaml"], ["quickstart"], ["retrain"], ["compare"], ["ui"]])
def test_bad_setting_stops_every_command(tmp_path, monkeypatch, command):
    (tmp_path / "jobs.yaml").write_text(GOOD)
    monkeypatch.setenv("MALLEABLE_INTERVAL_S", "soon")
    _one_line_error(CliRunner().invoke(app, command), 2, "MALLEABLE_INTERVAL_S='soon'")


def test_bad_flag_value_names_the_setting(tmp_path):
    (tmp_path / "jobs.yaml").write_text(GOOD)
    _one_line_error(CliRunner().invoke(app, ["run", "jobs.yaml", "--workers", "0"]), 2, "workers=0")


def test_retrain_bad_entry_point():
    _one_line_error(CliRunner().invoke(app, ["retrain", "no.such.module:fn"]), 2, "entrypoint='no.such.module:fn'")


def test_retrain_bad_batch_range():
    _one_line_error(CliRunner().invoke(app, ["retrain", "--min-batch", "64", "--max-batch", "8"]), 2, "min_batch=64")


def test_quickstart_bad_scale():
    _one_line_error(CliRunner().invoke(app, ["quickstart", "--scale", "0"]), 2, "scale=0")


def test_ui_prints_both_uis(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # no Prefect server configured
        result = CliRunner().invoke(app, ["ui"])
    assert result.exit_code == 0
    assert "mlflow ui --backend-store-uri sqlite:///" in result.output and "prefect server start" in result.output


def test_ui_honours_the_configured_prefect_api_and_hides_passwords(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("MALLEABLE_TRACKING_URI", "http://alice:hunter2@mlflow.internal:5000")
    with temporary_settings(updates={PREFECT_API_URL: "http://prefect.internal:4200/api"}):
        result = CliRunner().invoke(app, ["ui"])
    assert result.exit_code == 0, result.output
    assert "open http://prefect.internal:4200" in result.output and "prefect server start" not in result.output
    assert "open http://alice:***@mlflow.internal:5000" in result.output and "hunter2" not in result.output
