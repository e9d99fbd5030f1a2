"""A job's lifecycle as its coordinator sees it (cf. ``torch.distributed.elastic``'s ``WorkerState``).

Finer than the job's state the loop, the store and the CLI share (``allocator.loop.lifecycle.JobState``):
this one follows the coordinator's generations, hence its name ``CoordinatorState``.

    INIT -> STARTING -> RUNNING <-> RESCALING        (in-place or checkpoint-restart switch)
                        RUNNING <-> RECOVERING       (a generation lost ranks)
                        RUNNING  -> SUSPENDING -> STOPPED
    any -> SUCCEEDED (rank 0 reported the end) | FAILED (the job cannot go on) | STOPPED

SUCCEEDED and FAILED are final. A STOPPED job can still turn out SUCCEEDED: its last step
may have ended as the stop went out. The coordinator moves the state from the caller's
thread (start, rescale, stop) and from its event pump (end, failure, recovery).
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from enum import Enum


class CoordinatorState(str, Enum):
    INIT = "init"  # constructed; no rank exists
    STARTING = "starting"  # first generation launched, not yet training
    RUNNING = "running"  # a generation trains
    RESCALING = "rescaling"  # a new generation is being prepared or switched to
    RECOVERING = "recovering"  # a generation lost ranks; survivors (or a checkpoint) form the next
    SUSPENDING = "suspending"  # checkpoint, then every rank leaves (a service shutting down)
    STOPPED = "stopped"  # every rank told to leave before the end
    SUCCEEDED = "succeeded"  # trained to the end
    FAILED = "failed"  # cannot go on


FINAL = frozenset({CoordinatorState.SUCCEEDED, CoordinatorState.FAILED})


class Lifecycle:
    """The current state and every state so far, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._history = [CoordinatorState.INIT]

    @property
    def state(self) -> CoordinatorState:
        return self._history[-1]

    @property
    def history(self) -> tuple[CoordinatorState, ...]:
        with self._lock:
            return tuple(self._history)

    def move(self, to: CoordinatorState, only_from: Collection[CoordinatorState] | None = None) -> bool:
        """Enter ``to`` unless the job is in a final state (or not in ``only_from``); True if it moved."""
        with self._lock:
            now = self._history[-1]
            if now in FINAL or now == to or (only_from is not None and now not in only_from):
                return False
            self._history.append(to)
            return True
