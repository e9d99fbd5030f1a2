"""The README's test command, run N times while CPU burners hold cores (issue 39).

A test that waits on a fixed timeout passes on an idle box and fails on a loaded one, which is
where CI runs. This occupies ``--burners`` cores (default 1) with busy loops for the whole time
(separate processes at normal priority) and runs `python -m pytest` (the README's command:
parallel, everything CI runs) ``--runs`` times, printing each run's result, duration and
pass/fail counts. ``--burners 0`` times the suite on the box as it is (the idle figure).
Each invocation writes a results file under benchmarks/results/ (``python -m benchmarks
compare`` reads it): the command, commit, machine, load and every run's figures.

Run: python benchmarks/suite_under_burner.py [--runs 3] [--burners 1] [-- extra pytest args]
Last line: {"runs": N, "passed_runs": k, "burners": b, "max_minutes": m, "minutes": [...], "failed_tests": [...],
"speed_probe_cpu_s": [...]}

``speed_probe_cpu_s``: before each run, the CPU seconds one fixed piece of pure-Python work took
(median of three). The shared box's speed moves by itself (the same commit's suite took 824
CPU-s in one clean-clone run and 1,002 in the next, idle both times): a suite's minutes are
read beside it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import results  # noqa: E402 - after the path: run as a script


def _burn() -> None:
    while True:
        pass


def speed_probe_cpu_s(repeats: int = 3) -> float:
    """CPU seconds of a fixed loop in this process (median of ``repeats``): how fast the box is now."""
    took = []
    for _ in range(repeats):
        start = time.process_time()
        sum(i * i for i in range(10_000_000))
        took.append(time.process_time() - start)
    return round(sorted(took)[len(took) // 2], 3)


def _run_suite(pytest_args: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    # The README's command as a user runs it (pytest's cache on: each run orders files by the last).
    done = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, capture_output=True, text=True)
    return done, (time.monotonic() - start) / 60


def _record(argv: list[str], figures: dict, started: str, load_before: list[float] | None, out_dir: Path) -> Path:
    command = " ".join(["python benchmarks/suite_under_burner.py", *argv])
    entry = {
        "name": "suite_under_burner", "script": "benchmarks/suite_under_burner.py", "command": command,
        "status": "ok" if figures["passed_runs"] == figures["runs"] else "failed", "reason": "", "exit_code": None,
        "wall_s": round(sum(figures["minutes"]) * 60, 1), "figures": figures, "targets": {}, "output_tail": "",
    }  # fmt: skip
    record = {
        "schema": results.SCHEMA, "source": command, "started_at": started, "date": started[:10],
        "commit": results.git_commit(ROOT), "machine": results.machine(), "load_avg_before": load_before,
        "load_avg_after": results.load_avg(), "nice": None, "quick": False, "wall_s": entry["wall_s"],
        "note": f"the README's test command, {figures['runs']} run(s) beside {figures['burners']} CPU burner(s)", "benchmarks": [entry],
    }  # fmt: skip
    return results.write(record, out_dir, datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-suite")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--burners", type=int, default=1, help="cores held busy meanwhile (0: none, the idle figure)")
    parser.add_argument("--out", type=Path, default=results.RESULTS, help="folder for the results file")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs={args.runs}: must be at least 1")
    if args.burners < 0:
        parser.error(f"--burners={args.burners}: must be 0 or more")
    started, load_before = datetime.now(UTC).isoformat(timespec="seconds"), results.load_avg()
    burners = [multiprocessing.get_context("spawn").Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for burner in burners:
        burner.start()
    minutes, failed, passed_runs, probes = [], [], 0, []
    # Each run's whole output, for the failures' details (kept out of the repository: it is large).
    logs = Path(tempfile.mkdtemp(prefix="malleable-suite-"))
    try:
        for i in range(args.runs):
            probes.append(speed_probe_cpu_s())
            done, took = _run_suite(["-rfE", *args.pytest_args])
            minutes.append(round(took, 2))
            (logs / f"run-{i + 1}.txt").write_text(done.stdout + done.stderr)
            summary = next((line for line in reversed(done.stdout.splitlines()) if re.search(r"\d+ (passed|failed|errors?)", line)), "no summary")
            failures = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, flags=re.M)
            failed.extend(failures)
            passed_runs += done.returncode == 0
            print(f"run {i + 1}/{args.runs}: exit {done.returncode} in {took:.1f} min (speed probe {probes[-1]:.3f} CPU-s) — {summary.strip('= ')} (output: {logs / f'run-{i + 1}.txt'})", flush=True)
            for f in failures:
                print(f"  failed: {f}", flush=True)
    finally:
        for burner in burners:
            burner.terminate()
            burner.join(5)
    figures = {
        "runs": args.runs, "passed_runs": passed_runs, "burners": args.burners, "max_minutes": max(minutes),
        "minutes": minutes, "failed_tests": failed, "speed_probe_cpu_s": probes,
    }  # fmt: skip
    written = _record(argv, figures, started, load_before, args.out)
    print(f"results: {written.relative_to(ROOT) if written.is_relative_to(ROOT) else written}")
    print(json.dumps(figures))
    return 0 if passed_runs == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
