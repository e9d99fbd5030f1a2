"""`malleable simulate` through the real CLI: outputs written, experiments run, bad input is one line."""

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from allocator.workloads.arrivals import ArrivalSpec, generate_jobs
from allocator.workloads.trace import write_trace
from flows.cli import app
from tests.sim_helpers import PROFILES

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jobs.yaml"
runner = CliRunner(env={"COLUMNS": "200"})


def test_jobs_file_two_policies_writes_schedules_plots_summary(tmp_path):
    result = runner.invoke(app, ["simulate", str(EXAMPLE), "-p", "elastic_dp", "-p", "fixed_batch_dp", "--interval", "30", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("schedule-elastic_dp.csv", "schedule-fixed_batch_dp.csv", "jobs-completed.png", "gpus-per-job-elastic_dp.png"):
        assert (tmp_path / name).stat().st_size > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["elastic_dp"]["completed"] == 4
    assert (tmp_path / "schedule-elastic_dp.csv").read_text().startswith("time_s,job,gpus,batch\n")


def test_csv_trace_and_drop_mode(tmp_path):
    jobs = generate_jobs(ArrivalSpec("high", 30), PROFILES, np.random.default_rng(1))
    trace = tmp_path / "trace.csv"
    trace.write_text(write_trace(jobs, "csv", {f"cat{n}": p for n, p in PROFILES.items()}))
    result = runner.invoke(app, ["simulate", str(trace), "--gpus", "8", "--overflow", "drop", "--react", "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["elastic_dp"]["jobs"] == len(jobs)


def test_small_experiment_writes_summary(tmp_path):
    result = runner.invoke(app, ["simulate", "--experiment", "seed000-small", "--seeds", "1", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = (tmp_path / "summary.md").read_text()
    assert "40gpu-bursty-queue" in summary and "elastic" in summary
    assert (tmp_path / "40gpu-bursty-queue-completed.png").exists()


def test_idle_node_policies_route_to_the_replay():
    result = runner.invoke(app, ["simulate", "-p", "idle_nodes_greedy", "-p", "idle_nodes_fifo"])
    assert result.exit_code == 0, result.output
    assert "U" in result.output and "idle_nodes_greedy" in result.output


def test_bad_inputs_are_one_line(tmp_path):
    bad_row = tmp_path / "bad.csv"
    bad_row.write_text("name,submit_s,samples,min_batch,max_batch,max_gpus,category\na,soon,100,32,64,4,1\n")
    cases = [
        (["simulate", str(EXAMPLE), "-p", "nope"], "policy='nope'"),
        (["simulate", str(bad_row), "--gpus", "4"], "row 1, column submit_s='soon'"),
        (["simulate", str(EXAMPLE), "--gpus", "0"], "gpus=0"),
        (["simulate", "--experiment", "nope"], "experiment='nope'"),
        (["simulate"], "give either"),
        (["simulate", str(EXAMPLE), "--interval", "0"], "interval=0"),
        (["simulate", str(tmp_path / "missing.yaml")], "no such file"),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*args, "-o", str(tmp_path / "out")] if args[1:] and args[1] != "--experiment" else args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output, (args, result.output)


def test_bad_input_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["simulate", "--experiment", "nope"], ["simulate", str(EXAMPLE), "-p", "nope"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
    assert not (tmp_path / "out").exists()
