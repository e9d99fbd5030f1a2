"""`malleable serve` under the signals a process manager sends (issue 28.1): real processes,
a real Dask cluster, a sqlite store. Two SIGTERMs used to deadlock the service for good; one in
its first second killed it with 143 and no word. The bounds below are hang bounds only."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from service.client import ServiceClient
from service.store.records import JobState
from service.store import JobStore
from tests.service_process import entry, service_env, wait_until  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

HANG_BOUND_S = 90.0  # generous: the measured exit time is service_bench's double_sigterm_exit_s


def _handles(pid: int, sig: int) -> bool:
    """Has the process installed a handler for ``sig`` (its SigCgt mask in /proc)?"""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in text.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (sig - 1) & 1)


def _left_in_session(pid: int, bound_s: float = 15.0) -> list[str]:
    """The service's session's processes still running ``bound_s`` after it exited (its cluster's
    processes end after it; on a loaded box one took over a second): each as "pid status cmdline"."""
    deadline = time.monotonic() + bound_s
    while True:
        out = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == pid and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:120]}")
            except (OSError, psutil.Error):
                continue
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def _running_with_progress(start, store_url, env):
    env["MALLEABLE_WORKERS"] = "1"
    store = JobStore(store_url)
    job = ServiceClient(store).submit(entry("long", 5_000_000, max_gpus=1)).job_id
    svc = start()
    # Stepping (some 80 steps in; not necessarily past a periodic checkpoint: the stop takes one).
    wait_until(lambda: store.job(job).state is JobState.RUNNING and store.job(job).samples_done > 5_000, 180, "the job training", store)
    return svc, store, job


def test_two_sigterms_stop_the_service_cleanly_and_the_running_job_is_checkpointed(service_env):
    start, store_url, env, _cwd = service_env
    svc, store, job = _running_with_progress(start, store_url, env)
    progress_before = store.job(job).samples_done
    svc.proc.send_signal(signal.SIGTERM)
    # The second once the first was heard, well inside the stop (it checkpoints a running job
    # over Dask): two sent before the handler ran coalesce into one (POSIX), as on a loaded box.
    deadline = time.monotonic() + HANG_BOUND_S
    while not any("SIGTERM: stopping" in line for line in svc.lines) and svc.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    svc.proc.send_signal(signal.SIGTERM)  # systemd, then a shell: the one that used to deadlock
    rc = svc.proc.wait(timeout=HANG_BOUND_S)
    svc._reader.join(timeout=5)
    out = svc.output()
    assert rc == 0, out
    assert "SIGTERM: stopping" in out and "SIGTERM again: already stopping, ignored" in out, out
    assert "suspended 1 running job(s)" in out and "(checkpointed)" in out, out
    row = store.job(job)
    assert row.state is JobState.SUSPENDED and row.gpus == 0, row
    # Its checkpoint is on disk, at or beyond the progress seen before the signals.
    files = [p for p in Path(row.checkpoint_dir).rglob("*") if p.is_file()]
    assert files, row.checkpoint_dir
    assert row.samples_done >= progress_before
    assert _left_in_session(svc.proc.pid) == []


def test_three_sigterms_stop_at_once_and_leave_the_store_consistent(service_env):
    start, store_url, env, _cwd = service_env
    svc, store, job = _running_with_progress(start, store_url, env)
    # Each one after the service said it handled the one before: signals of one kind that arrive
    # before the handler runs coalesce into one (POSIX), so three sent at once may be heard as two.
    heard = ("SIGTERM: stopping", "SIGTERM again")
    for n in range(3):
        svc.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + HANG_BOUND_S
        while n < 2 and not any(heard[n] in line for line in svc.lines) and svc.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
    rc = svc.proc.wait(timeout=HANG_BOUND_S)
    svc._reader.join(timeout=5)
    out = svc.output()
    assert rc == 130, out
    assert "stopping at once" in out, out
    # Not "running" in the store with no service: suspended, to resume from its last checkpoint;
    # the lease released (not merely expired with its process).
    assert store.job(job).state is JobState.SUSPENDED, out
    from sqlalchemy import select

    from service.store import schema

    with store.engine.connect() as conn:
        assert conn.execute(select(schema.lease.c.holder)).scalar() is None


def test_a_sigterm_in_the_first_instant_is_handled(service_env):
    start, store_url, env, _cwd = service_env
    store = JobStore(store_url)
    job = ServiceClient(store).submit(entry("waits", 10_000)).job_id
    svc = start()
    deadline = time.monotonic() + HANG_BOUND_S
    while not _handles(svc.proc.pid, signal.SIGTERM):  # as soon as the interpreter runs our first line
        assert svc.proc.poll() is None and time.monotonic() < deadline, svc.output()
        time.sleep(0.005)
    svc.proc.send_signal(signal.SIGTERM)
    rc = svc.proc.wait(timeout=HANG_BOUND_S)
    svc._reader.join(timeout=5)
    out = svc.output()
    assert rc == 0, out
    assert "SIGTERM: stopping" in out and out.splitlines()[-1].endswith("stopped"), out
    assert store.job(job).state is JobState.QUEUED  # untouched: the next service runs it
    assert _left_in_session(svc.proc.pid) == []
