"""Run benchmark scripts as subprocesses and collect their last JSON line into one results file.

Each script runs in its own process (``python SCRIPT ARGS``, repository root as working
directory and on PYTHONPATH), under a timeout, in its own process group so that a timeout
kills whatever it started. A benchmark whose needs this machine lacks (a GPU, PostgreSQL,
network namespaces, the Pollux artifact) is recorded as skipped with the reason, as is a
benchmark without quick sizes under ``--quick``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import results
from benchmarks.harness.registry import Benchmark, Registry

TAIL_CHARS = 2000


def _postgres_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1.0):
            return True
    except OSError:
        return False


def _gpu() -> bool:
    return Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def _namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _pollux(root: Path) -> bool:
    return (root / "adaptdl" / "simulator").is_dir()


def missing_need(bench: Benchmark, root: Path) -> str | None:
    checks: dict[str, tuple[Callable[[], bool], str]] = {
        "gpu": (_gpu, "no GPU on this machine (no /dev/nvidia0, no nvidia-smi)"),
        "postgres": (_postgres_up, "PostgreSQL does not answer at 127.0.0.1:5432"),
        "namespaces": (_namespaces, "network namespaces need root and iproute2"),
        "pollux": (lambda: _pollux(root), "the Pollux OSDI'21 artifact is not at ./adaptdl/simulator (git clone -b osdi21-artifact https://github.com/petuum/adaptdl)"),
    }
    for need in bench.needs:
        ok, why = checks.get(need, (lambda: False, f"unknown need {need!r}"))
        if not ok():
            return why
    return None


def last_json(text: str) -> dict[str, Any] | None:
    """The last non-empty output line, if it is one JSON object (the benchmarks' contract)."""
    for line in reversed(text.splitlines()):
        if line.strip():
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


@dataclass(frozen=True)
class Outcome:
    exit_code: int | None
    wall_s: float
    output: str
    timed_out: bool


def run_once(argv: list[str], root: Path, timeout_s: float) -> Outcome:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return Outcome(proc.returncode, time.monotonic() - t0, out, False)
    except subprocess.TimeoutExpired:
        # The script's own children (Dask workers, servers) are in its session: end them all.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            out, _ = proc.communicate(timeout=15)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
        return Outcome(proc.returncode, time.monotonic() - t0, out or "", True)


def median_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's figures with every numeric leaf shared by all runs replaced by its median."""
    first = dict(runs[0])
    flat = [results.flatten(r) for r in runs]
    for key, value in flat[0].items():
        if "." in key or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        values = [f[key] for f in flat if isinstance(f.get(key), int | float) and not isinstance(f.get(key), bool)]
        if len(values) == len(runs):
            first[key] = statistics.median(values)
    return first


def run_benchmark(bench: Benchmark, root: Path, quick: bool, repeats: int = 1, python: str = sys.executable) -> dict[str, Any]:
    script = root / bench.script
    args = bench.quick if quick else bench.full
    entry: dict[str, Any] = {
        "name": bench.name, "script": bench.script, "command": None, "status": "skipped", "reason": "",
        "exit_code": None, "wall_s": None, "figures": {}, "targets": {}, "output_tail": "",
    }  # fmt: skip
    if not script.exists():
        entry["reason"] = f"{bench.script} is not in this checkout" + (f" (promised by {bench.landing})" if bench.landing else "")
        return entry
    if args is None:
        entry["reason"] = f"no quick size: {bench.quick_skip}"
        return entry
    why = missing_need(bench, root)
    if why:
        entry["reason"] = why
        return entry
    argv = [python, "-u", bench.script, *args]
    entry["command"] = ["python", *argv[1:]]  # the interpreter's path says nothing on another machine
    timeout_s = bench.quick_timeout_s if quick else bench.timeout_s
    figures: list[dict[str, Any]] = []
    walls: list[float] = []
    for _ in range(repeats):
        got = run_once(argv, root, timeout_s)
        walls.append(round(got.wall_s, 2))
        entry["exit_code"], entry["output_tail"] = got.exit_code, got.output[-TAIL_CHARS:]
        parsed = last_json(got.output)
        if got.timed_out:
            entry["status"], entry["reason"] = "timeout", f"ran past {timeout_s:.0f} s"
            break
        if got.exit_code != 0 or parsed is None:
            entry["status"] = "failed"
            entry["reason"] = f"exit code {got.exit_code}" if got.exit_code != 0 else "last output line is not one JSON object"
            break
        figures.append(parsed)
    else:
        entry["status"] = "ok"
    entry["wall_s"] = round(sum(walls), 2)
    if figures:
        entry["figures"] = median_figures(figures) if len(figures) > 1 else figures[0]
        if len(figures) > 1:
            entry["repeats"] = figures
            entry["repeat_wall_s"] = walls
        entry["targets"] = results.targets_for(bench, entry["figures"])
    return entry


def run(
    registry: Registry, names: list[str], quick: bool, out_dir: Path, repeats: int = 1, note: str = "",
    progress: Callable[[Benchmark, dict[str, Any] | None], None] | None = None,
) -> Path:  # fmt: skip
    root = Path(registry.root) if registry.root else results.REPO
    chosen = [registry.get(n) for n in names] if names else list(registry.benchmarks)
    started = datetime.now(UTC)
    doc: dict[str, Any] = {
        "schema": results.SCHEMA,
        "source": "python -m benchmarks run" + (" --quick" if quick else "") + (f" {' '.join(names)}" if names else ""),
        "started_at": started.isoformat(timespec="seconds"), "date": started.date().isoformat(),
        "commit": results.git_commit(root), "machine": results.machine(),
        "load_avg_before": results.load_avg(), "load_avg_after": None, "nice": os.nice(0),
        "quick": quick, "repeats": repeats, "wall_s": None, "note": note, "benchmarks": [],
    }  # fmt: skip
    t0 = time.monotonic()
    for bench in chosen:
        assert bench is not None  # names were checked by the command line
        if progress:
            progress(bench, None)
        entry = run_benchmark(bench, root, quick, repeats)
        doc["benchmarks"].append(entry)
        if progress:
            progress(bench, entry)
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    doc["load_avg_after"] = results.load_avg()
    stem = started.strftime("%Y%m%dT%H%M%SZ") + ("-quick" if quick else "")
    return results.write(doc, out_dir, stem)
