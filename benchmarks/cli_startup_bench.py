"""CLI start-up: `malleable --help` with lazily imported commands vs importing every command module
first (what the CLI did before: torch, Prefect, MLflow at start), side by side in one run.

Figures:
  help_s             median wall time of `python -m flows.commands.cli --help` (fresh process each run)
  eager_help_s       median wall time of the same after importing every command module (the old CLI)
  version_s          median wall time of `--version`
  speedup            eager_help_s / help_s
  help_heavy_modules heavy libraries (torch, prefect, mlflow, distributed) loaded by --help (want 0)
  run_simulate_s     median wall time of `malleable run examples/quickstart/jobs.yaml --simulate` in a fresh
                     directory (a new MLflow database each time; no Prefect API configured: none started)
  run_simulate_prefect_s  the same with MALLEABLE_PREFECT_RUNS=always (Prefect's ephemeral API, as before issue 35.7)
  plan_s             median wall time of `malleable plan examples/quickstart/jobs.yaml`

Run: python benchmarks/cli_startup_bench.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EAGER = "import importlib\nfrom flows.commands.cli import COMMANDS\nfor c in COMMANDS:\n    importlib.import_module(c.target.split(':')[0])\n"


def _timed(code: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _timed_cli(args: list[str], repeats: int, **env: str) -> float:
    """Median wall time of the CLI in a fresh directory each run (its own state and Prefect home)."""
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLEABLE_", "MLFLOW_", "PREFECT_"))}
            environ.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(Path(tmp) / "prefect"), **env)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "flows.commands.cli", *args], cwd=tmp, env=environ, capture_output=True, check=True)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    run_help = "from flows.commands.cli import app\ntry:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
    run_version = run_help.replace("--help", "--version")
    heavy_probe = run_help + "import sys\nprint(sum(m in sys.modules for m in ('torch', 'prefect', 'mlflow', 'distributed')))\n"
    heavy = int(subprocess.run([sys.executable, "-c", heavy_probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    help_s = _timed(run_help, args.repeats)
    eager_s = _timed(EAGER + run_help, args.repeats)
    version_s = _timed(run_version, args.repeats)
    jobs = str(ROOT / "examples" / "quickstart" / "jobs.yaml")
    slow_repeats = max(1, min(args.repeats, 3))
    simulate_s = _timed_cli(["run", jobs, "--simulate"], slow_repeats)
    simulate_prefect_s = _timed_cli(["run", jobs, "--simulate"], slow_repeats, MALLEABLE_PREFECT_RUNS="always")
    plan_s = _timed_cli(["plan", jobs], args.repeats)
    print(f"--help {help_s:.2f} s, eager imports then --help {eager_s:.2f} s, --version {version_s:.2f} s (median of {args.repeats})")
    print(f"run --simulate {simulate_s:.2f} s (with Prefect's ephemeral API {simulate_prefect_s:.2f} s, median of {slow_repeats}), plan {plan_s:.2f} s")
    print(json.dumps({
        "help_s": round(help_s, 3), "eager_help_s": round(eager_s, 3), "version_s": round(version_s, 3), "speedup": round(eager_s / help_s, 1),
        "help_heavy_modules": heavy, "run_simulate_s": round(simulate_s, 3), "run_simulate_prefect_s": round(simulate_prefect_s, 3), "plan_s": round(plan_s, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
