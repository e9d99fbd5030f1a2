"""Where the loop's jobs come from: a fixed list with arrival times, or a live feed.

A simulation and ``malleable run`` know every job up front (``StaticJobs``: each arrives at
its ``arrival_time``). A long-lived scheduler does not: its jobs are submitted while it runs,
and some are cancelled. Both are a ``JobSource`` the loop polls; only the source differs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from allocator.types import JobSpec

# Times closer than this are the same instant (guards float drift in simulated time).
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Arrivals:
    """What a poll found: new jobs (in the order they should queue), cancelled job ids, and
    whether the loop is asked to stop now (a service shutting down)."""

    jobs: tuple[JobSpec, ...] = ()
    cancelled: tuple[str, ...] = ()
    stop: bool = False


class JobSource(Protocol):
    def poll(self, now: float) -> Arrivals:
        """Jobs that arrived by ``now`` and were not returned before; cancellations since the last poll."""
        ...

    def next_arrival(self, now: float) -> float | None:
        """When a poll may next find something (a known arrival, or the next look at a live feed);
        None once no job will ever arrive again."""
        ...


class StaticJobs:
    """A fixed list of jobs, each arriving at its ``arrival_time`` (ties by job id)."""

    def __init__(self, jobs: Iterable[JobSpec]) -> None:
        self._pending = deque(sorted(jobs, key=lambda j: (j.arrival_time, j.id)))

    def poll(self, now: float) -> Arrivals:
        arrived = []
        while self._pending and self._pending[0].arrival_time <= now + EPS:
            arrived.append(self._pending.popleft())
        return Arrivals(jobs=tuple(arrived))

    def next_arrival(self, now: float) -> float | None:
        return self._pending[0].arrival_time if self._pending else None
