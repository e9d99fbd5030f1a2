"""Ctrl-C and SIGTERM for the commands that run a cluster: one clean, bounded shutdown path.

A terminal's Ctrl-C reaches its whole foreground process group, Prefect's ephemeral API
server included: after it, every Prefect call of the flow retries a dead server for minutes
(measured: 170-220 s and a screen of tracebacks). So the first signal does not unwind through
Prefect. It runs what the running command registered — stop the ranks, shut the cluster
down, end MLflow runs as KILLED — within a deadline, prints one line and exits 130. The job
store and the checkpoints are what a later run or service resumes from.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Signals are process-wide, so what a signal must clean up is too: one list for the process.
_cleanups: list[Callable[[], None]] = []


@contextmanager
def on_interrupt(cleanup: Callable[[], None]) -> Iterator[None]:
    """Run ``cleanup`` if a signal interrupts the block (later registrations run first)."""
    _cleanups.append(cleanup)
    try:
        yield
    finally:
        _cleanups.remove(cleanup)


def install(message: Callable[[str], str], deadline_s: float = 8.0) -> None:
    """From now on SIGINT/SIGTERM run the cleanups (at most ``deadline_s``), print
    ``message(signal name)`` as one line on stderr and end the process with 130."""

    def handle(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        worker = threading.Thread(target=_run_cleanups, daemon=True, name="malleable-interrupt")
        worker.start()
        worker.join(deadline_s)
        sys.stderr.write(f"error: {message(signal.Signals(signum).name)}\n")
        sys.stderr.flush()
        os._exit(130)

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)


def _run_cleanups() -> None:
    for cleanup in reversed(list(_cleanups)):
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - the next clean-up still gets its chance
            continue
