"""The store as the loop's ``JobSource``: new submissions, cancel requests, a stop.

A poll reads only what changed since the last one: submissions past the highest ``seq`` seen
(the primary key, so an index range, however long the queue) and cancel requests not yet
taken (an index on the two flags). On PostgreSQL a LISTEN connection hears each submission's
and cancel's NOTIFY: a poll with nothing heard reads nothing at all, and one with something
heard looks at once rather than at the next interval.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from allocator.fairness.teams import TeamTable
from allocator.loop.sources import Arrivals
from allocator.types import JobSpec
from service.jobs.entrypoints import entry_module, not_allowed, not_importable
from service.jobs.jobspec import check_submission
from service.store.listen import Listener
from service.store.records import JobRow, JobState
from service.store import JobStore, submitter_identity


class StoreFeed:
    """Looks at the store at most every ``poll_s``; first hands over ``resume`` (a restart's jobs).
    ``allowed``: MALLEABLE_ALLOWED_ENTRYPOINTS' patterns; a job outside them, or whose module
    cannot be imported here, fails before it is admitted. Every job carries its row's submitter;
    with ``teams`` its team is the submitter's there (identity from the store, not what a
    submission says), and ``team_of`` keeps each job's."""

    def __init__(
        self,
        store: JobStore,
        stop: threading.Event,
        poll_s: float = 0.2,
        resume: Sequence[JobRow] = (),
        on_poll: Callable[[float], None] | None = None,
        allowed: tuple[str, ...] | None = None,
        listen: bool = True,
        teams: TeamTable | None = None,
        team_of: dict[str, str] | None = None,
    ) -> None:
        if not (poll_s > 0):
            raise ValueError(f"poll_s={poll_s!r}: must be > 0")
        self.store, self.stop, self.poll_s, self.on_poll, self.allowed = store, stop, poll_s, on_poll, allowed
        self._resume = list(resume)
        self._last_seq = max((r.seq for r in resume), default=0)
        self._next_look = 0.0
        self.ids: set[str] = set()
        self._refused: dict[str, str | None] = {}  # module -> why it may not run (one check per module)
        self.listener = Listener.open(store) if listen else None
        self._first = True
        self.teams = teams
        self.team_of: dict[str, str] = {} if team_of is None else team_of

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()

    def _why_refused(self, workload: str) -> str | None:
        module = entry_module(workload)
        if module not in self._refused:
            why = not_allowed(workload, self.allowed)
            if why is None and ":" in workload:
                why = not_importable(workload)
            self._refused[module] = why
        return self._refused[module]

    def poll(self, now: float) -> Arrivals:
        if self.stop.is_set():
            return Arrivals(stop=True)
        heard = self.listener is not None and self.listener.heard()
        if now < self._next_look and not heard:
            return Arrivals()
        self._next_look = now + self.poll_s
        if self.listener is not None and not heard and not self._first and not self._resume:
            # Nothing was submitted or cancelled since the last look (every such write NOTIFYs).
            if self.on_poll is not None:
                self.on_poll(now)
            return Arrivals()
        self._first = False
        # By seq alone (the primary key's range): with a state filter PostgreSQL's planner takes
        # the state index and walks every queued job (24 ms at 10,000); new rows are few.
        fresh = self.store.jobs(after_seq=self._last_seq)
        self._last_seq = max([self._last_seq, *(r.seq for r in fresh)])
        rows = self._resume + [r for r in fresh if r.state is JobState.QUEUED]
        self._resume = []
        jobs: list[JobSpec] = []
        for row in rows:
            self._last_seq = max(self._last_seq, row.seq)
            if row.id in self.ids:
                continue
            why = self._why_refused(str(row.spec.get("workload", "")) if isinstance(row.spec, dict) else "")
            if why is not None:
                # Before admission: the service never imports what it may not run.
                self.store.set_state(row.id, JobState.FAILED, only_from=(JobState.QUEUED, JobState.SUSPENDED), error=f"entry point refused: {why}")
                continue
            try:
                # The one validator submit and the client passed (a store written by other means too).
                spec = dataclasses.replace(check_submission(row.job_spec()), arrival_time=now, submitter=row.submitter)  # it arrives on the loop's clock now
                if self.teams is not None:
                    spec = dataclasses.replace(spec, team=self.teams.team_of_submitter(submitter_identity(row.submitter)))
                    self.team_of[row.id] = spec.team or self.teams.default
                jobs.append(spec)
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
