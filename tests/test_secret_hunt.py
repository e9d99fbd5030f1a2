"""Issue 35.1: submitted code never sees the service's store credentials.

A real `malleable serve` on PostgreSQL as a role with a password, a real Dask cluster, gloo
training. The recipe (written here, run by the ranks) hunts for that password everywhere a
process of the same user can read: its environment, every /proc/*/environ and /proc/*/cmdline,
the files under its working directory (the state directory lives there), home and temp
directory. It hunts for the URL's shape (``<role>:<anything>@``), so it needs no copy of the
password. To show the hunt can find things, decoys are planted where the same reads reach:
a variable in the service's environment and a file in the working directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

from service.store import JobStore
from tests.service_helpers import PG_ADMIN, drop_postgres, postgres_url
from tests.service_process import PROFILE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

HUNTER = '''
import os
import re
import tempfile
from pathlib import Path

from elastic_tasks.examples import mlp_tiny

ROLE = {role!r}
DECOYS = {decoys!r}
REPORT = {report!r}
PATTERN = re.compile(re.escape(ROLE).encode() + rb":([^@\\s\\x00]+)@")


def _look(where, data, found):
    for match in PATTERN.finditer(data):
        found.append(f"{{where}}: password {{match.group(1).decode(errors='replace')}}")
    for decoy in DECOYS:
        if decoy.encode() in data:
            found.append(f"{{where}}: decoy {{decoy}}")


def hunt():
    found = []
    for name, value in os.environ.items():
        _look(f"env {{name}}", f"{{name}}={{value}}".encode(), found)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        for part in ("environ", "cmdline"):
            try:
                _look(f"/proc/{{proc.name}}/{{part}}", (proc / part).read_bytes(), found)
            except OSError:
                continue
    roots = {{Path.cwd(), Path.home(), Path(tempfile.gettempdir())}}
    for root in roots:
        for path in root.rglob("*"):
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_size < 64 * 2**20 and str(path) != REPORT:
                    _look(f"file {{path}}", path.read_bytes(), found)
            except OSError:
                continue
    return found


def recipe():
    found = hunt()
    with open(REPORT, "a") as f:
        f.write("\\n".join(["HUNT " + str(os.getpid()), *found]) + "\\n")
    print("hunt found:", found, flush=True)  # into the service's log, where a leak would land
    if any("password" in line for line in found):
        raise RuntimeError("found: " + "; ".join(found))  # into the job's error: jobs, wait
    return mlp_tiny()
'''


@pytest.fixture
def secret_store():
    """A database owned by a throwaway role that logs in with a password (the local server
    trusts any password: what matters is that the URL carries one)."""
    import sqlalchemy

    url = postgres_url()
    database = url.rsplit("/", 1)[1]
    role, password = f"hunt_{uuid.uuid4().hex[:8]}", f"Pw{uuid.uuid4().hex}"
    admin = sqlalchemy.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.exec_driver_sql(f"ALTER DATABASE {database} OWNER TO {role}")
    admin.dispose()
    yield f"postgresql+psycopg://{role}:{password}@127.0.0.1:5432/{database}", role, password
    drop_postgres(url)
    admin = sqlalchemy.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
    admin.dispose()


@pytest.fixture
def short_tmpdir():
    """A TMPDIR short enough for the sockets made under it (AF_UNIX paths: 107 bytes at most):
    multiprocessing's fork server listens at TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX, which under
    pytest's tmp_path passed the limit once the box's pytest run counter reached two digits
    (the service's workers never started: ``OSError: AF_UNIX path too long``)."""
    path = Path(tempfile.mkdtemp(prefix="hunt-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_recipe_hunting_for_the_store_password_finds_nothing(secret_store, tmp_path, short_tmpdir):
    url, role, password = secret_store
    decoy_env, decoy_file = f"envdecoy{uuid.uuid4().hex}", f"filedecoy{uuid.uuid4().hex}"
    work, home, tmp = tmp_path / "work", tmp_path / "home", short_tmpdir
    for d in (work, home):
        d.mkdir()
    report = tmp_path / "report.txt"  # outside every directory the hunt reads
    (work / "hunter.py").write_text(HUNTER.format(role=role, decoys=[decoy_env, decoy_file], report=str(report)))
    (work / "notes.txt").write_text(f"planted {decoy_file}\n")
    (work / "jobs.yaml").write_text(
        yaml.safe_dump({"jobs": [{"id": "hunt", "workload": "hunter:recipe", "profile": PROFILE, "samples": 4000, "min_batch": 32, "max_batch": 64, "max_gpus": 2}]})
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLEABLE_", "MLFLOW_", "PREFECT_"))}
    env.update(
        PYTHONPATH=str(REPO), HOME=str(home), TMPDIR=str(tmp), PREFECT_HOME=str(home / ".prefect"), COLUMNS="250",
        MALLEABLE_JOB_STORE=url, MALLEABLE_STATE_DIR=str(work / "state"), MALLEABLE_WORKERS="2", MALLEABLE_INTERVAL_S="2",
        MALLEABLE_SERVICE_POLL_S="0.2", HUNT_DECOY=decoy_env,
    )  # fmt: skip

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flows.commands.cli", *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)

    serve = subprocess.Popen(
        [sys.executable, "-m", "flows.commands.cli", "serve"], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in serve.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while not any("serving" in line for line in lines):
            assert serve.poll() is None and time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.2)
        submitted = cli("submit", "--file", "jobs.yaml")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job_id = submitted.stdout.split("\t")[0].strip()
        # The clients start once every rank has hunted, that is once the job has ended (read here,
        # in this process, whose environment never held the URL): a client process holds the URL in
        # its environment from its exec until the CLI's first line conceals it (deploy/worker_env.py),
        # a window a process of the same user could hit; one user id per role closes it. (Waiting for
        # the first rank's report only once let the second rank's hunt meet the next client.)
        store = JobStore(url, create=False)
        try:
            while not store.job(job_id).state.terminal:
                assert serve.poll() is None and time.monotonic() < deadline + 240, "\n".join(lines)
                time.sleep(0.2)
        finally:
            store.close()
        waited = cli("wait", job_id, "--timeout", "240")
        listed = cli("jobs", "--all", "--format", "json")
        hunts = report.read_text() if report.exists() else ""
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=90)
        reader.join(timeout=5)
    finally:
        for child in psutil.Process(serve.pid).children(recursive=True) if serve.poll() is None else ():
            child.kill()
        if serve.poll() is None:
            serve.kill()

    # The ranks ran the hunt (two ranks at least) and it can find what is within reach: the decoy
    # variable in its own environment and in the service's /proc/<pid>/environ, the decoy file.
    assert hunts.count("HUNT ") >= 1, hunts
    assert f"env HUNT_DECOY: decoy {decoy_env}" in hunts, hunts
    assert f"/proc/{serve.pid}/environ: decoy {decoy_env}" in hunts, hunts
    assert f"file {work / 'notes.txt'}: decoy {decoy_file}" in hunts, hunts
    # ... and not the password, anywhere.
    assert "password" not in hunts, hunts
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert [r["state"] for r in json.loads(listed.stdout)] == ["finished"], listed.stdout
    log = "\n".join(lines)
    for text in (hunts, log, waited.stdout + waited.stderr, listed.stdout + listed.stderr, submitted.stdout + submitted.stderr):
        assert password not in text
    # What the service wrote (MLflow's database and artifacts, checkpoints) holds no password either.
    written = [p for p in (work / "state").rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in written), written
    assert not [p for p in written if password.encode() in p.read_bytes()]
