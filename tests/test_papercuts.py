"""Small things a team meets first: `malleable jobs --watch` into a pipe, and the `cluster-run`
deployment's default jobs file showing what the system is for (in-place rescales)."""

from __future__ import annotations

import os
import pty
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import pytest
import yaml

from allocator.loop import LoopSettings
from allocator.policies import make_policy
from allocator.simulator.run import simulate
from allocator.specs import JobsFile
from allocator.types import RescaleKind
from flows.config.jobfile import load_jobs_file
from service.client import ServiceClient
from tests.service_helpers import job_entry

ROOT = Path(__file__).resolve().parents[1]


def _watch(store: str, cwd: Path, terminal: bool) -> tuple[subprocess.Popen, int | None]:
    """`malleable jobs --watch` into a pipe, or into a pseudo-terminal (a user's shell); the pty's
    master fd is returned for reading."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(PYTHONPATH=str(ROOT), MALLEABLE_JOB_STORE=store, COLUMNS="120")
    cmd = [sys.executable, "-m", "flows.commands.cli", "jobs", "--watch", "--interval", "0.2"]
    if not terminal:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE), None
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, cwd=cwd, env=dict(env, TERM="xterm"), stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    return proc, master


def _read_until(fd: int, text: bytes, limit_s: float) -> bytes:
    seen, end = b"", time.monotonic() + limit_s
    while text not in seen and time.monotonic() < end:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the pty's other side closed
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_jobs_watch_into_a_pipe_prints_a_table_per_interval(tmp_path):
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    ServiceClient(store, submitter="alice").submit(job_entry("queued-one"))
    proc, _ = _watch(store, tmp_path, terminal=False)
    seen = _read_until(proc.stdout.fileno(), b"queued-one", 240)
    seen += _read_until(proc.stdout.fileno(), b"queued-one", 60)  # a second table
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (seen + out).count(b"queued-one") >= 2, err
    assert proc.returncode == 0 and b"Traceback" not in err, err


@pytest.mark.slow
def test_ctrl_c_ends_the_watch_at_any_moment_quietly(tmp_path):
    """100 watches (pipe and terminal), each sent SIGINT at a random moment of its refresh loop
    (after its first table): every one exits 0, with no traceback, within a hang check; the
    seconds from the signal to the exit are printed (the figure; a loaded box stretches it)."""
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    ServiceClient(store, submitter="alice").submit(job_entry("queued-one"))
    rng = random.Random(39)
    latencies, failures = [], []
    # Five watches are up at any time: the next starts as one ends, so its start-up overlaps the
    # others' random waits instead of following them (batches of five waited for their slowest).
    up = deque(_watch(store, tmp_path, terminal=n % 2 == 0) for n in range(5))
    for n in range(100):
        proc, master = up.popleft()
        fd = master if master is not None else proc.stdout.fileno()
        started = _read_until(fd, b"queued-one", 240)
        time.sleep(rng.uniform(0.0, 0.6))  # anywhere in a 0.2 s refresh: a query, a write, a sleep
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        drain = threading.Thread(target=_read_until, args=(fd, b"\0never", 30), daemon=True)
        drain.start()  # keep reading, as a terminal or `| cat` does
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        latencies.append(time.monotonic() - sent)
        if n + 5 < 100:
            up.append(_watch(store, tmp_path, terminal=(n + 5) % 2 == 0))
        err = proc.stderr.read()
        if b"queued-one" not in started or proc.returncode != 0 or b"Traceback" in err:
            failures.append((n, master is not None, proc.returncode, err[-500:]))
        if master is not None:
            os.close(master)
    latencies.sort()
    print(f"SIGINT to exit over {len(latencies)} watches: median {latencies[len(latencies) // 2]:.2f} s, max {latencies[-1]:.2f} s")
    assert not failures, failures
    assert len(latencies) == 100 and latencies[-1] < 30


def test_the_cluster_run_deployments_default_jobs_rescale_in_place():
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (deployment,) = [d for d in project["deployments"] if d["name"] == "cluster-run"]
    spec: JobsFile = load_jobs_file(ROOT / deployment["parameters"]["jobs_file"])
    result = simulate(spec.jobs, make_policy(spec.policy or "elastic_dp"), spec.gpus or 4, LoopSettings(interval_s=deployment["parameters"]["interval_s"]))
    in_place = [e for e in result.events if e.kind is RescaleKind.IN_PLACE]
    # Every job overlaps another: each arrival shrinks a running job, each completion grows one.
    assert len(in_place) >= 3 and {e.job_id for e in in_place} == {j.id for j in spec.jobs}
    assert all(r.finish is not None for r in result.jobs)
