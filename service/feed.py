"""The store as the loop's ``JobSource``: new submissions, cancel requests, a stop."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from allocator.sources import Arrivals
from allocator.types import JobSpec
from service.jobspec import spec_for_loop
from service.records import JobRow, JobState
from service.store import JobStore


class StoreFeed:
    """Looks at the store at most every ``poll_s``; first hands over ``resume`` (a restart's jobs)."""

    def __init__(
        self,
        store: JobStore,
        stop: threading.Event,
        poll_s: float = 0.2,
        resume: Sequence[JobRow] = (),
        on_poll: Callable[[float], None] | None = None,
    ) -> None:
        if not (poll_s > 0):
            raise ValueError(f"poll_s={poll_s!r}: must be > 0")
        self.store, self.stop, self.poll_s, self.on_poll = store, stop, poll_s, on_poll
        self._resume = list(resume)
        self._last_seq = max((r.seq for r in resume), default=0)
        self._next_look = 0.0
        self.ids: set[str] = set()

    def poll(self, now: float) -> Arrivals:
        if self.stop.is_set():
            return Arrivals(stop=True)
        if now < self._next_look:
            return Arrivals()
        self._next_look = now + self.poll_s
        rows = self._resume + self.store.jobs(states=[JobState.QUEUED], after_seq=self._last_seq)
        self._resume = []
        jobs: list[JobSpec] = []
        for row in rows:
            self._last_seq = max(self._last_seq, row.seq)
            if row.id in self.ids:
                continue
            try:
                jobs.append(spec_for_loop(row.spec, row.id, now))
            except ValueError as exc:  # a store edited by hand, or by another version's rules
                self.store.set_state(row.id, JobState.FAILED, error=f"invalid job spec: {exc}")
                continue
            self.ids.add(row.id)
        cancelled = tuple(self.store.take_cancel_requests())
        if self.on_poll is not None:
            self.on_poll(now)
        return Arrivals(jobs=tuple(jobs), cancelled=cancelled)

    def next_arrival(self, now: float) -> float:
        return max(now, self._next_look)
