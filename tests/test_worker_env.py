"""Issue 35.1, the parts of the trust boundary one process shows: what a worker's environment
keeps, and a concealed secret gone from the C environment and from /proc/<pid>/environ while
Python's os.environ keeps it. Real child processes; no mocks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deploy.worker_env import SECRET_NAMES, worker_environ

REPO = Path(__file__).resolve().parents[1]


def test_a_worker_environment_keeps_all_but_the_secrets():
    given = {
        "PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "object-store-key", "GLOO_SOCKET_IFNAME": "eth0",
        "MALLEABLE_JOB_STORE": "sqlite:///jobs.db", "PREFECT_API_KEY": "pnu_x", "MLFLOW_TRACKING_URI": "http://mlflow:5000",
        "SOME_URL": "postgresql://alice:s3cret@db/x", "PLAIN_URL": "postgresql://alice@db/x",
    }  # fmt: skip
    kept = worker_environ(given)
    # Named service credentials go whatever their value; any URL with user:password@ goes whatever its name.
    dropped = {name for name in given if name in SECRET_NAMES} | {"SOME_URL"}
    assert kept == {name: value for name, value in given.items() if name not in dropped}


def test_concealed_secrets_leave_the_c_environment_and_proc_environ_but_not_os_environ():
    password = "Zq8-conceal-test-pw"
    script = (
        "import os, subprocess, sys\n"
        "from deploy.worker_env import conceal_secrets\n"
        "names = conceal_secrets()\n"
        "own = open('/proc/self/environ', 'rb').read()\n"
        "child = subprocess.run([sys.executable, '-c', 'import os; print(dict(os.environ))'], capture_output=True, text=True).stdout\n"
        f"print(names, {password!r}.encode() in own, b'KEEP=visible' in own, {password!r} in child, 'visible' in child, os.environ['STORE_URL'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "MALLEABLE_JOB_STORE": f"postgresql://u:{password}@h/db", "STORE_URL": f"mysql://u:{password}@h/x", "KEEP": "visible"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out[:1] == ["('MALLEABLE_JOB_STORE',"] and out[1] == "'STORE_URL')"
    assert out[2:6] == ["False", "True", "False", "True"]
    assert out[6] == f"mysql://u:{password}@h/x"
