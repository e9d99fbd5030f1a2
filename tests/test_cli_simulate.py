"""`malleable simulate` through the real CLI: outputs written, experiments run, bad input is one line."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from allocator.workloads.arrivals import ArrivalSpec, generate_jobs
from allocator.workloads.trace import write_trace
from flows.commands.cli import app
from tests.sim_helpers import PROFILES

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jobs.yaml"
runner = CliRunner(env={"COLUMNS": "200"})


def test_jobs_file_two_policies_writes_schedules_plots_summary(tmp_path):
    result = runner.invoke(app, ["simulate", str(EXAMPLE), "-p", "elastic_dp", "-p", "fixed_batch_dp", "--interval", "30", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in ("schedule-elastic_dp.csv", "schedule-fixed_batch_dp.csv", "jobs-completed.png", "gpus-per-job-elastic_dp.png"):
        assert (tmp_path / name).stat().st_size > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["policies"]["elastic_dp"]["completed"] == 4
    assert (tmp_path / "schedule-elastic_dp.csv").read_text().startswith("time_s,job,gpus,batch,accum_steps\n")


def test_csv_trace_and_drop_mode(tmp_path):
    jobs = generate_jobs(ArrivalSpec("high", 30), PROFILES, np.random.default_rng(1))
    trace = tmp_path / "trace.csv"
    trace.write_text(write_trace(jobs, "csv", {f"cat{n}": p for n, p in PROFILES.items()}))
    result = runner.invoke(app, ["simulate", str(trace), "--gpus", "8", "--overflow", "drop", "--react", "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["policies"]["elastic_dp"]["jobs"] == len(jobs)


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


# ---------------------------------------------------------------- a user's own trace (issue 16)

def _write_profile(directory: Path, name: str, iter_times=(0.008, 0.016, 0.032, 0.064)) -> None:
    """t(b) = b / 1000 s at b = 8..64 per GPU, 1 ms ring latency, no bandwidth term."""
    directory.mkdir(exist_ok=True)
    body = {"workload": name, "num_params": 1_000_000, "batch_sizes": [8, 16, 32, 64], "iter_times_s": list(iter_times),
            "max_batch_per_gpu": 64, "allreduce": {"latency_s": 0.001, "seconds_per_param": 0.0}}
    (directory / f"{name}.json").write_text(json.dumps(body))


def _trace(path: Path, rows: list[str]) -> Path:
    path.write_text("name,submit_s,samples,min_batch,max_batch,max_gpus,elastic,gpus,profile\n" + "\n".join(rows) + "\n")
    return path


def _stops(schedule_csv: str) -> dict[str, float]:
    stops = {}
    for line in schedule_csv.splitlines()[1:]:
        t, job, gpus = line.split(",")[:3]
        if gpus == "0":
            stops[job] = float(t)
    return stops


def test_own_profiles_start_cost_makespan_and_mean_jct(tmp_path):
    _write_profile(tmp_path / "prof", "mynet")
    trace = _trace(tmp_path / "t.csv", ["a,0,64000,64,64,4,true,,mynet", "b,100,32000,64,64,4,true,,mynet"])
    out = tmp_path / "o"
    result = runner.invoke(app, ["simulate", str(trace), "--gpus", "4", "--profiles", str(tmp_path / "prof"), "--start-cost", "5", "--no-plots", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "profiles from" in result.output and "mynet" in result.output
    # Alone on 4 GPUs: T(64, 4) = 64 / (16 / 1000 + 2 * 3 * 0.001) = 2909.09 samples/s, after a 5 s
    # start: a ends at 5 + 64000 * 0.022 / 64 = 27.0, before b arrives; b at 100 + 5 + 11.0 = 116.
    summary = json.loads((out / "summary.json").read_text())["policies"]["elastic_dp"]
    stops = _stops((out / "schedule-elastic_dp.csv").read_text())
    assert stops["a"] == pytest.approx(27.0) and stops["b"] == pytest.approx(116.0)
    assert summary["makespan_s"] == pytest.approx(116.0, abs=0.05)
    assert summary["avg_jct_s"] == pytest.approx((27.0 + 16.0) / 2, abs=0.05)
    assert "p95_jct_s" in summary and "makespan min" in result.output
    assert not list(out.glob("*.png"))  # --no-plots


def test_non_monotone_profile_names_the_entry_and_the_envelope_accepts_it(tmp_path):
    _write_profile(tmp_path / "prof", "noisy", iter_times=(0.008, 0.016, 0.0155, 0.064))
    trace = _trace(tmp_path / "t.csv", ["a,0,6400,64,64,4,true,,noisy"])
    args = ["simulate", str(trace), "--gpus", "4", "--profiles", str(tmp_path / "prof"), "--no-plots", "-o", str(tmp_path / "o")]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2, refused.output
    assert "noisy.json" in refused.output and "iter_times_s[2]=0.0155" in refused.output and "Traceback" not in refused.output
    assert not (tmp_path / "o").exists()
    accepted = runner.invoke(app, [*args, "--monotone-envelope"])
    assert accepted.exit_code == 0, accepted.output
    unknown = runner.invoke(app, ["simulate", str(_trace(tmp_path / "u.csv", ["a,0,6400,64,64,4,true,,other"])), "--gpus", "4", "--profiles", str(tmp_path / "prof"), "--monotone-envelope", "-o", str(tmp_path / "u")])
    assert unknown.exit_code == 2 and "profile='other'" in unknown.output and "noisy" in unknown.output


def test_fixed_batch_backfills_unless_strict_fifo_and_params_reach_the_policy(tmp_path):
    _write_profile(tmp_path / "prof", "mynet")
    # r holds 3 of 4 GPUs for long; big (2 GPUs) cannot start; small (1 GPU) behind it can.
    trace = _trace(tmp_path / "t.csv", ["r,0,640000,192,192,3,false,3,mynet", "big,1,6400,128,128,2,false,2,mynet", "small,2,6400,64,64,1,false,1,mynet"])
    base = ["simulate", str(trace), "--gpus", "4", "--profiles", str(tmp_path / "prof"), "-p", "fixed_batch", "--no-plots"]
    starts = {}
    for label, extra in (("default", []), ("strict", ["--strict-fifo"]), ("param", ["--param", "fixed_batch:strict_fifo=true"])):
        result = runner.invoke(app, [*base, *extra, "-o", str(tmp_path / label)])
        assert result.exit_code == 0, result.output
        rows = (tmp_path / label / "schedule-fixed_batch.csv").read_text().splitlines()[1:]
        starts[label] = min(float(r.split(",")[0]) for r in rows if r.split(",")[1] == "small" and r.split(",")[2] != "0")
    assert starts["default"] == pytest.approx(2.0)  # backfilled at once
    assert starts["strict"] > 100 and starts["param"] == starts["strict"]  # waits behind big
    bad = runner.invoke(app, ["simulate", str(trace), "--gpus", "4", "--profiles", str(tmp_path / "prof"), "--param", "nope=1", "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "param='nope=1': policy elastic_dp takes no parameters" in bad.output


def test_restart_rescales_charge_the_restart_cost(tmp_path):
    _write_profile(tmp_path / "prof", "mynet")
    trace = _trace(tmp_path / "t.csv", ["a,0,640000,64,256,4,true,,mynet", "b,50,64000,64,256,4,true,,mynet"])
    args = ["simulate", str(trace), "--gpus", "4", "--profiles", str(tmp_path / "prof"), "--no-plots", "--rescale", "restart", "--restart-cost", "30"]
    result = runner.invoke(app, [*args, "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())["policies"]["elastic_dp"]
    assert summary["rescales"] >= 1 and summary["rescale_cost_s"] == pytest.approx(30.0 * summary["rescales"])
    bad = runner.invoke(app, [*args[:-1], "-1", "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "restart_cost=-1.0" in bad.output and not (tmp_path / "bad").exists()


def test_react_default_is_the_loops(tmp_path):
    # Issue 16: the CLI defaulted to --no-react while LoopSettings reacts.
    _write_profile(tmp_path / "prof", "mynet")
    trace = _trace(tmp_path / "t.csv", ["a,0,64000,64,64,4,true,,mynet", "b,100,32000,64,64,4,true,,mynet"])
    schedules = {}
    for label, extra in (("default", []), ("react", ["--react"]), ("no-react", ["--no-react"])):
        args = ["simulate", str(trace), "--gpus", "4", "--profiles", str(tmp_path / "prof"), "--interval", "600", "--no-plots"]
        result = runner.invoke(app, [*args, *extra, "-o", str(tmp_path / label)])
        assert result.exit_code == 0, result.output
        schedules[label] = (tmp_path / label / "schedule-elastic_dp.csv").read_text()
    assert schedules["default"] == schedules["react"] != schedules["no-react"]


def test_simulate_command_module_imports_no_heavy_framework():
    code = "import sys, flows.commands.simulate; print(sorted(m for m in ('torch', 'prefect', 'mlflow', 'matplotlib', 'dask') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
