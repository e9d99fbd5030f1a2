"""Faults and bad inputs: how many are met cleanly, and nothing hangs.

Each probe is a function ``(workdir) -> dict`` of figures; the figures of all probes are
merged (counts add up, ``seconds_*`` keep the worst) and printed as one JSON object on the
last line. Append a probe to ``PROBES`` to add a kind of fault.

Figures (so far):
  bad_inputs_tried        bad inputs over every command (tests/bad_input_cases.py), in-process
  bad_inputs_clean        of those: the asked exit code, one line naming the field and value,
                          no traceback, nothing written (no store created), none of the case's
                          absent texts (a password, a raw escape), within the case's time limit
  hostile_inputs_tried    of the bad inputs: issue 37's classes (tests/hostile_cases.py)
  hostile_inputs_clean    of those: clean
  faults_injected         damaged local state and unreachable services injected
  faults_survived         of those: named in one line (or journaled and replayed), no traceback
  hangs                   probes and bad-input cases that ran past their time limit
  seconds_to_fail_compare_unreachable   `malleable compare` against a port nobody listens on
  seconds_to_exit_after_job_failure     `malleable run` of a failing and a good job: from the bad
                          job's first failing step to the command's exit (the good one finishes)
  seconds_to_exit_after_sigint          Ctrl-C (SIGINT to the process group) of a running
                          `malleable run`: to the process's exit, one line, no orphans
  seconds_to_exit_after_double_sigterm  two SIGTERMs to an idle `malleable serve` (issue 28;
                          benchmarks/service_faults.py also sends one in its first instant,
                          three, Ctrl-C twice, a hostile job name, a read-only PostgreSQL role)

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

from tests.bad_input_cases import CASES, MLP, _c, describe, make_inputs, run_case  # noqa: E402
from tests.hostile_cases import hostile_cases  # noqa: E402
from tests.recipe_sources import failing_forward_recipe  # noqa: E402

Figures = dict[str, float]
TIME_LIMIT_S = 120.0


def bad_inputs(work: Path) -> Figures:
    root = work / "bad-inputs"
    make_inputs(root)
    hostile_ids = {case.id for case in hostile_cases(_c, MLP)}
    clean = hangs = hostile_clean = 0
    for case in CASES:
        outcome = run_case(case, root)  # each under tests.bad_input_cases.CASE_LIMIT_S
        clean += outcome.clean
        hostile_clean += outcome.clean and case.id in hostile_ids
        hangs += outcome.hung
        if not outcome.clean:
            print("not clean:", describe(outcome))
    return {
        "bad_inputs_tried": len(CASES), "bad_inputs_clean": clean,
        "hostile_inputs_tried": len(hostile_ids), "hostile_inputs_clean": hostile_clean, "hangs": hangs,
    }  # fmt: skip


def _cli(args: list[str], cwd: Path, **env: str) -> tuple[int, list[str], bool, float]:
    """Run ``malleable ARGS`` as a process: exit code, output lines, traceback seen, seconds."""
    full = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250", **env}
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=TIME_LIMIT_S)
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
    tracker = f"from flows.recording.tracking import MetricPoint, Tracker\nt = Tracker({uri!r}, 'exp', {str(journal)!r}, notify=print)\n"
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
    # quickstart runs a flow (compare reads MLflow only and needs no Prefect)
    code, lines, tb, seconds = _cli(["quickstart"], work, PREFECT_HOME=str(home), PREFECT_API_URL="")
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


PROFILE = {
    "workload": "mlp_tiny", "hardware": "bench", "num_params": 6532, "batch_sizes": [8, 16, 32, 64],
    "iter_times_s": [0.004, 0.006, 0.010, 0.018], "max_batch_per_gpu": 64,
}  # fmt: skip
FAILING_RECIPE = failing_forward_recipe("failing", "injected failure", stamp_file="failed_at")


def _jobs_file(path: Path, jobs: list[dict]) -> None:
    import yaml

    path.write_text(yaml.safe_dump({"profiles": {"p": PROFILE}, "jobs": [{"profile": "p", "min_batch": 32, "max_batch": 64, "max_gpus": 1, **j} for j in jobs]}))


def _run_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(PYTHONPATH=str(REPO), MALLEABLE_WORKERS="2", PREFECT_HOME=str(work / "prefect"), COLUMNS="250")
    return env


def _orphans(session: int, wait_s: float = 10.0) -> list[str]:
    """Processes of the command's session still alive ``wait_s`` after it exited (its Prefect
    server and Dask processes get the signal too and need a moment to end)."""
    import psutil

    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == session or p.ppid() == session:
                    left.append(" ".join(p.cmdline())[:120])
            except (OSError, psutil.Error):
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def job_failure(work: Path) -> Figures:
    """A job whose ranks raise: reported as failed with the cause, the other job finishes, exit 1."""
    root = work / "job-failure"
    root.mkdir()
    (root / "failing.py").write_text(FAILING_RECIPE)
    _jobs_file(root / "jobs.yaml", [{"id": "bad", "workload": "failing:recipe", "samples": 50_000}, {"id": "good", "workload": "mlp_tiny", "samples": 30_000}])
    try:
        proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", "run", "jobs.yaml"], cwd=root, env=_run_env(work), capture_output=True, text=True, timeout=TIME_LIMIT_S * 2)
    except subprocess.TimeoutExpired:
        return {"faults_injected": 1, "faults_survived": 0, "hangs": 1}
    exited = time.time()
    failed_at = float((root / "failed_at").read_text()) if (root / "failed_at").exists() else None
    out = proc.stdout + proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    ok = proc.returncode == 1 and len(errors) == 1 and "job bad failed" in errors[0] and "injected failure" in errors[0] and "Traceback" not in out and "good" in proc.stdout
    if not ok:
        print("job failure not clean:", proc.returncode, errors, out[-800:])
    return {"faults_injected": 1, "faults_survived": int(ok), "seconds_to_exit_after_job_failure": None if failed_at is None else round(exited - failed_at, 2)}


def sigint(work: Path) -> Figures:
    """Ctrl-C in a terminal: SIGINT to the whole process group of a running `malleable run`."""
    import signal

    root = work / "sigint"
    root.mkdir()
    _jobs_file(root / "jobs.yaml", [{"id": "long", "workload": "mlp_tiny", "samples": 5_000_000, "max_gpus": 2, "max_batch": 128}])
    proc = subprocess.Popen([sys.executable, "-m", "flows.commands.cli", "run", "jobs.yaml"], cwd=root, env=_run_env(work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    store = root / ".malleable"
    deadline = time.monotonic() + TIME_LIMIT_S
    # Interrupt once training is under way: the job has written its first checkpoint.
    while time.monotonic() < deadline and not list(store.glob("checkpoints/**/state.pt")):
        time.sleep(0.2)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return {"faults_injected": 1, "faults_survived": 0, "hangs": 1}
    took = time.monotonic() - sent
    lines = [x for x in (out + err).splitlines() if x.strip() and "interrupted" in x]
    orphans = _orphans(proc.pid)
    ok = proc.returncode == 130 and len(lines) == 1 and "Traceback" not in out + err and not orphans
    if not ok:
        print("sigint not clean:", proc.returncode, (out + err)[-800:], "left running:", orphans)
    return {"faults_injected": 1, "faults_survived": int(ok), "seconds_to_exit_after_sigint": round(took, 2)}


from benchmarks.service_faults import service_faults  # noqa: E402

PROBES: list[Callable[[Path], Figures]] = [bad_inputs, damaged_state, unreachable, job_failure, sigint, service_faults]


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
