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
  jobs_s             median wall time of `malleable jobs` on a store holding one queued job
  jobs_cpu_s         median CPU seconds (user + system) of the same process
  jobs_heavy_modules numpy, pulp, torch, prefect, mlflow, distributed loaded by `malleable jobs` (want 0)
  watch_exit_s       median seconds from SIGINT to the exit of `jobs --watch --interval 0.2` into a pipe,
                     sent 0.3 s after its first table (issue 39: within 2 s)

Run: python benchmarks/cli_startup_bench.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python benchmarks/cli_startup_bench.py`: the store's client and the tests' job entry
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


def _jobs_figures(repeats: int) -> dict[str, float]:
    """`malleable jobs` and `jobs --watch` on a store with one queued job, a fresh process each run."""
    from service.client import ServiceClient
    from tests.service_helpers import job_entry

    def cpu() -> float:
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        return used.ru_utime + used.ru_stime

    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{Path(tmp) / 'jobs.db'}"
        ServiceClient(store, submitter="bench").submit(job_entry("queued-one"))
        environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
        environ.update(PYTHONPATH=str(ROOT), MALLEABLE_JOB_STORE=store, COLUMNS="120")
        cli = [sys.executable, "-m", "flows.commands.cli", "jobs"]
        walls, cpus, exits = [], [], []
        for _ in range(repeats):
            c0, t0 = cpu(), time.perf_counter()
            subprocess.run(cli, cwd=tmp, env=environ, capture_output=True, check=True)
            walls.append(time.perf_counter() - t0)
            cpus.append(cpu() - c0)
            watch = subprocess.Popen([*cli, "--watch", "--interval", "0.2"], cwd=tmp, env=environ, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            seen = b""
            while b"queued-one" not in seen:
                seen += os.read(watch.stdout.fileno(), 65536)
            time.sleep(0.3)
            sent = time.perf_counter()
            watch.send_signal(signal.SIGINT)
            watch.communicate(timeout=60)
            exits.append(time.perf_counter() - sent)
        probe = "import runpy, sys\nsys.argv = ['malleable', 'jobs']\ntry:\n    runpy.run_module('flows.commands.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        probe += "print(sum(m in sys.modules for m in ('numpy', 'pulp', 'torch', 'prefect', 'mlflow', 'distributed')))\n"
        heavy = int(subprocess.run([sys.executable, "-c", probe], cwd=tmp, env=environ, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    return {"jobs_s": round(statistics.median(walls), 3), "jobs_cpu_s": round(statistics.median(cpus), 3), "jobs_heavy_modules": heavy, "watch_exit_s": round(statistics.median(exits), 3)}


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
    listing = _jobs_figures(args.repeats)
    print(f"--help {help_s:.2f} s, eager imports then --help {eager_s:.2f} s, --version {version_s:.2f} s (median of {args.repeats})")
    print(f"jobs {listing['jobs_s']:.2f} s ({listing['jobs_cpu_s']:.2f} CPU-s), jobs --watch ends {listing['watch_exit_s']:.3f} s after SIGINT")
    print(f"run --simulate {simulate_s:.2f} s (with Prefect's ephemeral API {simulate_prefect_s:.2f} s, median of {slow_repeats}), plan {plan_s:.2f} s")
    print(json.dumps({
        "help_s": round(help_s, 3), "eager_help_s": round(eager_s, 3), "version_s": round(version_s, 3), "speedup": round(eager_s / help_s, 1),
        "help_heavy_modules": heavy, "run_simulate_s": round(simulate_s, 3), "run_simulate_prefect_s": round(simulate_prefect_s, 3), "plan_s": round(plan_s, 3),
        **listing,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
