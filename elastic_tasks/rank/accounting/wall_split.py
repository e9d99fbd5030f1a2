"""A rank's timeline of named phases (``allocator.wall_split``): what it spends its wall time on.

The rank marks what it does with ``WallTimeline.phase(Phase.X)`` (a context manager; phases
nest, the innermost owns the time: an evaluation inside a step's agreement is evaluation, not
steps). Adjacent intervals of one phase merge, so a generation of steps between two checkpoints
is one interval and a timeline holds a few per checkpoint, not one per step. Recording costs
two clock reads per phase change and nothing per step beyond them (no synchronisation).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from allocator.wall_split import Phase, PhaseInterval

__all__ = ["Phase", "PhaseInterval", "WallTimeline"]

# A nested phase shorter than this stays its outer phase's time: otherwise a per-step check
# (is an evaluation due?) would cut the steps into one interval each.
MIN_NESTED_S = 1e-3


class WallTimeline:
    """One rank's phases over wall time (``time.time``; injectable for tests)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._closed: list[PhaseInterval] = []
        # The newest interval, still growing: [phase, start, end]. A step extends it in place; a
        # PhaseInterval per step (frozen, to replace the last) was most of what recording cost.
        self._tail: list | None = None
        self._scopes: dict[Phase, _Scope] = {}
        # Open phases, innermost last: (phase, when it began, when its current segment began).
        self._stack: list[tuple[Phase, float, float]] = []

    def record(self, phase: Phase, t0: float, t1: float) -> None:
        """An interval timed by the caller (e.g. the rank's set-up, before the timeline existed)."""
        self._close(phase, t0, t1)

    @property
    def intervals(self) -> list[PhaseInterval]:
        return list(self.snapshot())

    def _close(self, phase: Phase, t0: float, t1: float) -> None:
        if t1 <= t0:
            return
        tail = self._tail
        if tail is not None and tail[0] is phase and t0 - tail[2] < 1e-3:
            tail[2] = t1
            return
        if tail is not None:
            self._closed.append(PhaseInterval(*tail))
        self._tail = [phase, t0, t1]

    def phase(self, phase: Phase) -> _Scope:
        """``with timeline.phase(Phase.STEPS): ...`` — a reused object, not a generator: it runs on
        every step, so it costs two clock reads and a list push/pop, nothing more."""
        scope = self._scopes.get(phase)
        if scope is None:
            scope = self._scopes[phase] = _Scope(self, phase)
        return scope

    def _enter(self, phase: Phase) -> None:
        now = self._clock()
        self._stack.append((phase, now, now))

    def _exit(self, phase: Phase) -> None:
        now = self._clock()
        _, began, segment = self._stack.pop()
        if not self._stack:
            self._close(phase, segment, now)
            return
        outer, outer_began, outer_segment = self._stack[-1]
        if now - began < MIN_NESTED_S:
            return  # a check that found nothing to do (an evaluation not due): the outer phase's time
        self._close(outer, outer_segment, began)
        self._close(phase, segment, now)
        self._stack[-1] = (outer, outer_began, now)

    def snapshot(self) -> tuple[PhaseInterval, ...]:
        tail = self._tail
        return (*self._closed, PhaseInterval(*tail)) if tail is not None else tuple(self._closed)


class _Scope:
    __slots__ = ("_timeline", "_phase")

    def __init__(self, timeline: WallTimeline, phase: Phase) -> None:
        self._timeline, self._phase = timeline, phase

    def __enter__(self) -> None:
        self._timeline._enter(self._phase)

    def __exit__(self, *exc: object) -> None:
        self._timeline._exit(self._phase)
