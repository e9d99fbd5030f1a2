"""The README's test command, run N times while a CPU burner holds one core (issue 39).

A test that waits on a fixed timeout passes on an idle box and fails on a loaded one, which is
where CI runs. This occupies one core with a busy loop for the whole time (a separate process at
normal priority) and runs `python -m pytest` (the README's command: parallel, everything CI runs)
``--runs`` times, printing each run's result, duration and pass/fail counts.

Run: python benchmarks/suite_under_burner.py [--runs 3] [-- extra pytest args]
Last line: {"runs": N, "passed_runs": k, "minutes": [...], "failed_tests": [...]}
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _burn() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs={args.runs}: must be at least 1")
    burner = multiprocessing.get_context("spawn").Process(target=_burn, daemon=True)
    burner.start()
    minutes, failed, passed_runs = [], [], 0
    try:
        for i in range(args.runs):
            start = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args.pytest_args], cwd=ROOT, capture_output=True, text=True)
            took = (time.monotonic() - start) / 60
            minutes.append(round(took, 1))
            summary = next((line for line in reversed(done.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", line)), "no summary")
            failures = re.findall(r"^FAILED (\S+)", done.stdout, flags=re.M)
            failed.extend(failures)
            passed_runs += done.returncode == 0
            print(f"run {i + 1}/{args.runs}: exit {done.returncode} in {took:.1f} min — {summary.strip('= ')}", flush=True)
            for f in failures:
                print(f"  failed: {f}", flush=True)
    finally:
        burner.terminate()
        burner.join(5)
    print(json.dumps({"runs": args.runs, "passed_runs": passed_runs, "minutes": minutes, "failed_tests": failed}))
    return 0 if passed_runs == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
