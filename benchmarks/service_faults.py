"""The service's faults for benchmarks/faults_bench.py (issue 28): signals to `malleable serve`,
hostile names (refused at submit), a read-only database role. (The service's bad inputs are in
tests/service_bad_cases.py and counted by faults_bench's ``bad_inputs`` probe.)

Figures: faults_injected / faults_survived / hangs (added up with the other probes), and
``seconds_to_exit_after_double_sigterm`` (an idle service, two SIGTERMs 0.3 s apart).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIME_LIMIT_S = 120.0
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _env(work: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(PYTHONPATH=str(REPO), COLUMNS="200", MALLEABLE_STATE_DIR=str(work / "state"), MALLEABLE_WORKERS="1", PREFECT_HOME=str(work / "prefect"), **extra)
    return env


def _serve_signals(work: Path, signals: list[tuple[float, int]], wait_for: str | None) -> tuple[int, str, float]:
    """Start `serve`, wait for ``wait_for`` in its output (None: for its SIGTERM handler), send
    ``signals`` (delay before each, signal); exit code (-1: hung), output, seconds to exit."""
    proc = subprocess.Popen([sys.executable, "-m", "flows.commands.cli", "serve"], cwd=work, env=_env(work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    import threading

    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    deadline = time.monotonic() + TIME_LIMIT_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if wait_for is None and _handles_sigterm(proc.pid) or wait_for is not None and any(wait_for in x for x in lines):
                break
            time.sleep(0.01)
        t0 = time.monotonic()
        for delay, sig in signals:
            time.sleep(delay)
            proc.send_signal(sig)
        try:
            proc.wait(timeout=TIME_LIMIT_S)
        except subprocess.TimeoutExpired:
            return -1, "".join(lines), TIME_LIMIT_S
        return proc.returncode, "".join(lines), time.monotonic() - t0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _handles_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(x.split()[1] for x in status.splitlines() if x.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def _cli(work: Path, *args: str, **env: str) -> tuple[int, str]:
    try:
        done = subprocess.run([sys.executable, "-m", "flows.commands.cli", *args], cwd=work, env=_env(work, **env), capture_output=True, text=True, timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        return -1, ""
    return done.returncode, done.stdout + done.stderr


def service_faults(work: Path) -> dict[str, float]:
    injected = survived = hangs = 0
    figures: dict[str, float] = {}
    # Signals: two SIGTERMs (the one that deadlocked), one in the first instant, three (fast stop), Ctrl-C twice.
    cases = [
        ("double-sigterm", [(0.0, signal.SIGTERM), (0.3, signal.SIGTERM)], "serving", 0, "already stopping, ignored"),
        ("early-sigterm", [(0.0, signal.SIGTERM)], None, 0, "stopped"),
        ("triple-sigterm", [(0.0, signal.SIGTERM), (0.05, signal.SIGTERM), (0.05, signal.SIGTERM)], "serving", None, "SIGTERM"),
        ("double-sigint", [(0.0, signal.SIGINT), (0.05, signal.SIGINT)], "serving", None, "SIGINT"),
    ]
    for name, signals, wait_for, want_rc, needle in cases:
        case_dir = work / name
        case_dir.mkdir()
        rc, out, seconds = _serve_signals(case_dir, signals, wait_for)
        injected += 1
        hangs += rc == -1
        ok = rc != -1 and (want_rc is None or rc == want_rc) and needle in out and "Traceback" not in out
        survived += ok
        if not ok:
            print(f"service signal {name} not clean: rc={rc}", out[-600:])
        if name == "double-sigterm":
            figures["seconds_to_exit_after_double_sigterm"] = round(seconds, 2)
    # A hostile name: refused at submit (one line, escaped), nothing stored; the listing shows nothing raw.
    hostile = "\x1b[31mRED\x1b[0m\x1b]0;pwned\x07\nforged"
    injected += 1
    store = f"sqlite:///{work / 'hostile' / 'jobs.db'}"
    rc1, refused = _cli(work, "submit", "elastic_tasks.examples:mlp_tiny", "--samples", "100", "--name", hostile, MALLEABLE_JOB_STORE=store)
    rc2, shown = _cli(work, "submit", "elastic_tasks.examples:mlp_tiny", "--samples", "100", "--name", "plain", MALLEABLE_JOB_STORE=store)
    rc3, listed = _cli(work, "jobs", MALLEABLE_JOB_STORE=store)
    raw = any(c in refused + listed for c in "\x1b\x07")
    ok = rc1 == 2 and len([x for x in refused.splitlines() if x.strip()]) == 1 and "control characters" in refused and rc2 == rc3 == 0 and not raw and "plain" in listed
    survived += ok
    hangs += -1 in (rc1, rc2, rc3)
    if not ok:
        print("hostile name not clean:", rc1, rc2, rc3, refused[-300:], listed[-300:])
    # A read-only PostgreSQL role submitting and cancelling: one line naming the role, exit 2.
    pg = _read_only_role()
    if pg is not None:
        url, cleanup = pg
        try:
            for args in (("submit", "elastic_tasks.examples:mlp_tiny", "--samples", "100"), ("cancel", "j0000000000a")):
                injected += 1
                rc, out = _cli(work, *args, MALLEABLE_JOB_STORE=url)
                lines = [x for x in out.splitlines() if x.strip()]
                ok = rc in (2,) and len(lines) == 1 and ("may not" in lines[0] or "JOB_ID" in lines[0]) and "Traceback" not in out
                survived += ok
                hangs += rc == -1
                if not ok:
                    print("read-only role not clean:", rc, out[-400:])
        finally:
            cleanup()
    return {"faults_injected": injected, "faults_survived": survived, "hangs": hangs, **figures}


def _read_only_role():
    """A fresh database with the job store made by postgres and a SELECT-only role on it, or None."""
    try:
        import sqlalchemy

        from service.client import ServiceClient  # noqa: F401 - the store's tables
        from service.store import JobStore

        name = f"malleable_faults_{uuid.uuid4().hex[:8]}"
        admin = sqlalchemy.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
        JobStore(url).close()
        role = f"ro_{name}"
        db = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
        with db.connect() as conn:
            conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
            conn.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        db.dispose()
    except Exception as exc:  # noqa: BLE001 - no server: the probe says so and skips these
        print(f"PostgreSQL not reachable ({type(exc).__name__}): read-only role probe skipped")
        return None

    def cleanup() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
        admin.dispose()

    return url.replace("postgres@", f"{role}@"), cleanup
