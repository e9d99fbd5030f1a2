"""What both modelled clusters share: jobs whose finish times are known, kept in one heap.

A modelled job advances at a rate its physics gives (throughput, or goodput over a noise
trajectory); only a rescale changes the rate. Completions are kept in a heap of
(time, priority, sequence, job, version) so that equal times pop in a fixed order (SimPy's
rule); an entry made stale by a later rescale (older version) is skipped lazily. Subclasses
say how a job's state is made, what a change costs it and what rate a share gives it.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Generic, Protocol, TypeVar

from allocator.loop.execution import JobFailure, share_changes
from allocator.loop import EPS
from allocator.types import Allocation, JobSpec, RescaleEvent, RescaleKind, Share


class ModelledJob(Protocol):
    spec: JobSpec
    done: float
    since: float
    paused_until: float
    version: int
    finished: bool

    def progress_at(self, t: float) -> float: ...

    def settle(self, t: float) -> None: ...

    def finish_time(self) -> float | None: ...

    def run(self, share: Share | None) -> None:
        """Set the job's rate(s) for ``share`` (None: not running)."""


J = TypeVar("J", bound=ModelledJob)


class ModelledCluster(Generic[J]):
    """The loop's executor protocol over modelled jobs; physics and costs come from hooks."""

    def __init__(self) -> None:
        self._jobs: dict[str, J] = {}
        self._heap: list[tuple[float, int, int, str, int]] = []
        self._sequence = 0

    def _new_job(self, spec: JobSpec, now: float) -> J:
        raise NotImplementedError

    def _change_cost(self, job_id: str, before: Share | None, after: Share | None, resumed: bool = False) -> tuple[RescaleKind, float]:
        """``resumed``: a start of a job that ran here before (preempted, now admitted again)."""
        raise NotImplementedError

    def apply(self, now: float, previous: Allocation, new: Allocation, jobs: Mapping[str, JobSpec]) -> list[RescaleEvent]:
        events = []
        for job_id, before, after in share_changes(previous, new):
            state = self._jobs.get(job_id)
            resumed = state is not None and before is None
            if state is None:
                state = self._jobs[job_id] = self._new_job(jobs[job_id], now)
            if state.finished:
                continue
            state.settle(now)
            kind, lost = self._change_cost(job_id, before, after, resumed)
            state.paused_until = now + lost
            state.run(after)
            state.version += 1
            finish = state.finish_time()
            if finish is not None:
                self._sequence += 1
                heapq.heappush(self._heap, (finish, 0, self._sequence, job_id, state.version))
            events.append(RescaleEvent(now, job_id, before, after, kind, cost_s=lost, measured=False))
        return events

    def progress(self, job_id: str, now: float) -> float:
        state = self._jobs.get(job_id)
        if state is None:
            return 0.0
        return state.done if state.finished else state.progress_at(now)

    def _pop_stale(self) -> None:
        while self._heap:
            _, _, _, job_id, version = self._heap[0]
            state = self._jobs[job_id]
            if state.finished or state.version != version:
                heapq.heappop(self._heap)
            else:
                return

    def completed(self, now: float) -> list[str]:
        done = []
        self._pop_stale()
        while self._heap and self._heap[0][0] <= now + EPS:
            job_id = heapq.heappop(self._heap)[3]
            state = self._jobs[job_id]
            state.done, state.since, state.finished = float(state.spec.work_samples), now, True
            state.run(None)
            done.append(job_id)
            self._pop_stale()
        return done

    def next_completion(self, now: float) -> float | None:
        self._pop_stale()
        return self._heap[0][0] if self._heap else None

    def failed(self, now: float) -> list[JobFailure]:
        """A modelled job never fails."""
        return []

    def in_effect(self, allocation: Allocation) -> Allocation:
        """A modelled job always runs on what it was given."""
        return allocation
