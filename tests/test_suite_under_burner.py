"""benchmarks/suite_under_burner.py: the suite N times beside busy cores, each run's verdict and
minutes printed, and the invocation kept as a results file that `benchmarks compare` reads.

Real pytest runs of a small selection (a passing file and a failing one, written here); the
busy loops are counted as live processes while the suite runs (the probe test sees them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "suite_under_burner.py"

# Counts, from inside the suite's run, the busy loops beside it: the script's other children that
# are runnable at every look (a busy loop never sleeps; the resource tracker does), however loaded
# the box is.
PROBE = '''
import os, time, psutil

def test_burners_are_busy_meanwhile():
    others = [p for p in psutil.Process(os.getppid()).children() if p.pid != os.getpid()]
    runnable = {p.pid: 0 for p in others}
    for _ in range(20):
        for p in others:
            runnable[p.pid] += p.status() == psutil.STATUS_RUNNING
        time.sleep(0.05)
    open(os.environ["BURNERS_SEEN"], "w").write(str(sum(n == 20 for n in runnable.values())))
'''
FAILING = "def test_fails():\n    assert 1 == 2\n"


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out_dir = tmp_path / "results"
    env = {**os.environ, "BURNERS_SEEN": str(tmp_path / "seen")}
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out_dir), *args], cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    (written,) = out_dir.glob("*-suite.json")
    return done, json.loads(written.read_text())


def test_two_runs_beside_a_burner_pass_and_are_kept_as_data(tmp_path: Path) -> None:
    # One burner, as the README's command runs it: each burns a whole core for the test's length.
    (tmp_path / "test_probe.py").write_text(PROBE)
    done, record = _run(tmp_path, "--runs", "2", "--burners", "1", "--", str(tmp_path / "test_probe.py"), "-p", "no:hypothesispytest")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "seen").read_text() == "1"
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["runs"] == 2 and last["passed_runs"] == 2 and last["burners"] == 1 and last["failed_tests"] == []
    assert len(last["minutes"]) == 2 and last["max_minutes"] == max(last["minutes"]) > 0
    assert len(last["speed_probe_cpu_s"]) == 2 and all(0 < p < 60 for p in last["speed_probe_cpu_s"])
    (entry,) = record["benchmarks"]
    assert record["schema"] == 1 and entry["name"] == "suite_under_burner" and entry["figures"] == last
    assert "--burners 1" in record["source"] and record["commit"]["sha"] and record["load_avg_before"] is not None
    # `compare` reads it, figure by figure.
    written = str(next((tmp_path / "results").glob("*-suite.json")))
    shown = subprocess.run([sys.executable, "-m", "benchmarks", "compare", written, written], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "passed_runs" in shown.stdout and "max_minutes" in shown.stdout, shown.stdout + shown.stderr


def test_a_failing_run_fails_the_script_and_names_the_test(tmp_path: Path) -> None:
    (tmp_path / "test_failing.py").write_text(FAILING)
    done, record = _run(tmp_path, "--runs", "1", "--burners", "0", "--", str(tmp_path / "test_failing.py"), "-p", "no:hypothesispytest", "-rf")
    assert done.returncode == 1
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["passed_runs"] == 0 and [t.endswith("test_failing.py::test_fails") for t in last["failed_tests"]] == [True]
    assert record["benchmarks"][0]["status"] == "failed"


def test_bad_counts_are_one_line_exit_2() -> None:
    for flag, value in (("--runs", "0"), ("--burners", "-1")):
        done = subprocess.run([sys.executable, str(SCRIPT), flag, value], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and f"{flag}={value}" in done.stderr and "Traceback" not in done.stderr
