"""Stopping a server a test started: terminate, a bounded wait, then kill — never an assertion.

A loaded box can take longer than any fixed wait to stop a server (MLflow's gunicorn workers,
Prefect's uvicorn); the test's verdict is what it asserted before, not how fast teardown was.
Servers started with ``start_new_session=True`` are stopped as a whole process group.
"""

from __future__ import annotations

import os
import signal
import subprocess


def stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    if process.poll() is not None:
        return
    group = _own_group(process)
    _signal(process, group, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal(process, group, signal.SIGKILL)
        process.wait()
    if group is not None:
        try:
            os.killpg(group, signal.SIGKILL)  # children the server left behind
        except ProcessLookupError:
            pass


def _own_group(process: subprocess.Popen) -> int | None:
    try:
        group = os.getpgid(process.pid)
    except ProcessLookupError:
        return None
    return group if group != os.getpgid(0) else None


def _signal(process: subprocess.Popen, group: int | None, sig: int) -> None:
    try:
        if group is not None:
            os.killpg(group, sig)
        else:
            process.send_signal(sig)
    except ProcessLookupError:
        pass
