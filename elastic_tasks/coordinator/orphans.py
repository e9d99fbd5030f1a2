"""Ranks whose coordinator died (a crashed service): tell them to checkpoint and stop.

A successor service cannot re-attach to ranks it did not start; it asks them, over their
job board, to write a checkpoint and leave, and resumes the job from that checkpoint. The
plan the ranks obey is the coordinator's own wire type, so it is built here, beside the
other coordinator parts, not by the service.
"""

from __future__ import annotations

from elastic_tasks.board import EventKind, JobBoard
from elastic_tasks.protocol import Plan, PlanKind

# A stop plan names no members, so no batch applies; Plan still wants a valid one.
_NO_BATCH = 1


def stop_orphaned(board: JobBoard) -> None:
    """Publish a checkpoint-and-stop plan newer than any the dead coordinator published."""
    latest = board.latest_version()
    board.publish(Plan((latest or 0) + 1, PlanKind.CHECKPOINT_STOP, (), _NO_BATCH))


def has_stopped(board: JobBoard, timeout_s: float = 0.05) -> bool:
    """Whether the orphaned ranks reported that they stopped (or finished) within ``timeout_s``."""
    return any(e.kind in (EventKind.STOPPED, EventKind.FINISHED) for e in board.drain(timeout=timeout_s))
