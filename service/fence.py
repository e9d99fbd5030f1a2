"""After a crash: make sure none of the dead service's ranks still trains before its jobs resume.

We resume from checkpoints rather than re-attach to ranks that may still run: the dead
service's futures, monitor threads and generation bookkeeping died with it, and rebuilding
them from the scheduler would be a second, rarely exercised path. Instead the successor
tells the old ranks (on the old job boards) to checkpoint and stop, waits for them, and —
if the dead service had started its own cluster — shuts that orphaned cluster down.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from distributed import Client

from elastic_tasks.board import JobBoard
from elastic_tasks.coordinator.orphans import has_stopped, stop_orphaned
from service.store.records import JobRow, LeaseInfo


@dataclass(frozen=True, slots=True)
class Fenced:
    reached: bool  # the old cluster answered
    stopped: tuple[str, ...]  # jobs whose ranks checkpointed and stopped
    shut_down: bool  # the old, service-owned cluster was shut down


def fence(previous: LeaseInfo, jobs: Sequence[JobRow], current: Client, timeout_s: float = 20.0, stale_s: float = 15.0) -> Fenced:
    if not previous.cluster_address:
        return Fenced(False, (), False)
    same = previous.cluster_address == current.scheduler.address
    try:
        old = current if same else Client(previous.cluster_address, timeout=3, set_as_default=False)
    except (OSError, TimeoutError):
        return Fenced(False, (), False)  # gone with the service: nothing of it still trains
    try:
        # Only jobs whose ranks still report (a recent status on their board) need telling; the
        # others died with the service. (The scheduler forgets a dead client's tasks, so its task
        # lists cannot say which ranks still run.)
        boards = {}
        for r in jobs:
            board = JobBoard(r.board_id, old) if r.board_id else None
            status = board.status() if board is not None else None
            if status is not None and time.time() - status.time < stale_s:
                boards[r.id] = board
        for board in boards.values():
            stop_orphaned(board)
        stopped: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while len(stopped) < len(boards) and time.monotonic() < deadline:
            for job_id, board in boards.items():
                if job_id not in stopped and has_stopped(board):
                    stopped.add(job_id)
        shut = False
        if previous.cluster_owned and not same:
            old.shutdown()
            shut = True
        return Fenced(True, tuple(sorted(stopped)), shut)
    finally:
        if not same:
            old.close()
