"""What the loop needs from the world: a clock and an executor (simulated or real), and the
changes an executor must make between two allocations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from allocator.types import Allocation, JobSpec, RescaleEvent, Share


@dataclass(frozen=True, slots=True)
class JobFailure:
    """A job the executor gave up on (every rank lost with no checkpoint, its entry point raised, ...)."""

    job_id: str
    reason: str


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep_until(self, t: float) -> None: ...


class Executor(Protocol):
    def apply(self, now: float, previous: Allocation, new: Allocation, jobs: Mapping[str, JobSpec]) -> list[RescaleEvent]:
        """Make the cluster run ``new``: start, grow, shrink or stop jobs; one event per changed job."""
        ...

    def progress(self, job_id: str, now: float) -> float:
        """Samples the job has processed by ``now``."""
        ...

    def completed(self, now: float) -> list[str]:
        """Jobs that finished all their samples by ``now``, each reported once."""
        ...

    def next_completion(self, now: float) -> float | None:
        """Earliest time a running job may finish, if known (exact when simulated)."""
        ...

    def failed(self, now: float) -> list[JobFailure]:
        """Jobs that failed by ``now``, each reported once; their GPUs are free again."""
        ...

    def in_effect(self, allocation: Allocation) -> Allocation:
        """``allocation`` as the cluster really runs it: a job that lost a worker runs on fewer GPUs."""
        ...


def share_changes(previous: Allocation, new: Allocation) -> list[tuple[str, Share | None, Share | None]]:
    """(job, before, after) for every job whose share differs — what an executor must do."""
    changes = []
    for job_id, share in new.shares:
        before = previous.get(job_id)
        if before != share:
            changes.append((job_id, before, share))
    for job_id, share in previous.shares:
        if job_id not in new:
            changes.append((job_id, share, None))
    return changes
