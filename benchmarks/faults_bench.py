"""Faults and bad inputs: how many are met cleanly, and nothing hangs.

Each probe is a function ``(workdir) -> dict`` of figures; the figures of all probes are
merged (counts add up, ``seconds_*`` keep the worst) and printed as one JSON object on the
last line. Append a probe to ``PROBES`` to add a kind of fault.

Figures (so far):
  bad_inputs_tried        bad inputs over every command (tests/bad_input_cases.py), in-process
  bad_inputs_clean        of those: the asked exit code, one line naming the field and value,
                          no traceback, nothing written
  faults_injected         damaged local state and unreachable services injected
  faults_survived         of those: named in one line (or journaled and replayed), no traceback
  hangs                   probes that ran past their time limit
  seconds_to_fail_compare_unreachable   `malleable compare` against a port nobody listens on

Run: python benchmarks/faults_bench.py [--only bad_inputs]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.bad_input_cases import CASES, describe, make_inputs, run_case  # noqa: E402

Figures = dict[str, float]
TIME_LIMIT_S = 120.0


def bad_inputs(work: Path) -> Figures:
    root = work / "bad-inputs"
    make_inputs(root)
    clean = 0
    for case in CASES:
        outcome = run_case(case, root)
        clean += outcome.clean
        if not outcome.clean:
            print("not clean:", describe(outcome))
    return {"bad_inputs_tried": len(CASES), "bad_inputs_clean": clean}


def _cli(args: list[str], cwd: Path, **env: str) -> tuple[int, list[str], bool, float]:
    """Run ``malleable ARGS`` as a process: exit code, output lines, traceback seen, seconds."""
    full = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250", **env}
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        return -1, [], False, TIME_LIMIT_S
    out = proc.stdout + proc.stderr
    return proc.returncode, [x for x in out.splitlines() if x.strip()], "Traceback" in out, time.monotonic() - started


def _python(script: str) -> subprocess.CompletedProcess:
    """A fresh process, as each CLI command is (mlflow caches a store per URI in a process)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=TIME_LIMIT_S)


def _sqlite(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", ((i, "x" * 200) for i in range(3000)))
    conn.close()
    return path


def damaged_state(work: Path) -> Figures:
    """A truncated MLflow store and a torn journal line (records must arrive), a truncated Prefect database."""
    injected = survived = hangs = 0
    # 1 + 2: MLflow store truncated mid-file, then a torn last journal line; each command a new process.
    root = work / "state"
    root.mkdir()
    db, journal = root / "mlflow.db", root / "buffer.jsonl"
    uri = f"sqlite:///{db}"
    tracker = f"from flows.tracking import MetricPoint, Tracker\nt = Tracker({uri!r}, 'exp', {str(journal)!r}, notify=print)\n"
    _python(tracker + "t.end_run(t.start_run('before'))\n")
    os.truncate(db, db.stat().st_size // 2)
    proc = _python(tracker + "r = t.start_run('during'); t.log_metrics(r, [MetricPoint('loss', v, i) for i, v in enumerate([3.0, 2.0, 1.0])]); t.end_run(r)\n")
    injected += 1
    survived += proc.returncode == 0 and "Traceback" not in proc.stderr and str(db) in proc.stdout and journal.exists()
    with journal.open("a") as f:
        f.write('{"op": "log_batch", "ru')
    injected += 1
    db.rename(db.with_name("mlflow.db.damaged"))
    proc = _python(tracker + "print(t.flush())\n")
    check = _python(
        f"from mlflow import MlflowClient\nc = MlflowClient({uri!r}); e = c.get_experiment_by_name('exp')\n"
        "[r] = [r for r in c.search_runs([e.experiment_id]) if r.info.run_name == 'during']\n"
        "print(sorted(m.value for m in c.get_metric_history(r.info.run_id, 'loss')))\n"
    )
    survived += proc.returncode == 0 and "skipped 1 damaged line" in proc.stdout and check.stdout.strip().endswith("[1.0, 2.0, 3.0]")
    # 3: Prefect's database truncated: one line naming it before any flow.
    home = work / "prefect-home"
    home.mkdir()
    prefect_db = _sqlite(home / "prefect.db")
    os.truncate(prefect_db, prefect_db.stat().st_size // 2)
    code, lines, tb, seconds = _cli(["compare"], work, PREFECT_HOME=str(home), PREFECT_API_URL="")
    injected += 1
    hangs += code == -1
    survived += code == 2 and len(lines) == 1 and not tb and "Prefect database" in lines[0]
    return {"faults_injected": injected, "faults_survived": survived, "hangs": hangs}


def unreachable(work: Path) -> Figures:
    """MLflow at a port nobody listens on: compare fails in one line, quickly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, lines, tb, seconds = _cli(["compare"], work, MALLEABLE_TRACKING_URI=f"http://127.0.0.1:{port}")
    ok = code == 1 and len(lines) == 1 and not tb and "unreachable" in lines[0]
    return {"faults_injected": 1, "faults_survived": int(ok), "hangs": int(code == -1), "seconds_to_fail_compare_unreachable": round(seconds, 2)}


PROBES: list[Callable[[Path], Figures]] = [bad_inputs, damaged_state, unreachable]


def merge(into: Figures, new: Figures) -> None:
    for key, value in new.items():
        if key.startswith("seconds_"):
            into[key] = max(into.get(key, 0.0), value)
        else:
            into[key] = into.get(key, 0) + value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=[p.__name__ for p in PROBES], action="append", help="run only these probes")
    args = parser.parse_args()
    figures: Figures = {"bad_inputs_tried": 0, "bad_inputs_clean": 0, "faults_injected": 0, "faults_survived": 0, "hangs": 0}
    started = time.monotonic()
    for probe in PROBES:
        if args.only and probe.__name__ not in args.only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"faults-{probe.__name__}-") as tmp:
            t0 = time.monotonic()
            got = probe(Path(tmp))
            print(f"{probe.__name__}: {got} ({time.monotonic() - t0:.1f} s)")
            merge(figures, got)
    figures["bench_wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
