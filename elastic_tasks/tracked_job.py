"""What ``DaskExecutor`` knows of one job (``TrackedJob``), apart from the executor that acts on it."""

from __future__ import annotations

from dataclasses import dataclass

from allocator.physics.goodput import WorkMeter
from allocator.types import Share
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.coordinator.outcomes import JobResult
from elastic_tasks.coordinator.refit_watch import JobRefit


@dataclass(slots=True)
class TrackedJob:
    """Everything the executor knows of one job: one record, not a container per fact."""

    coordinator: JobCoordinator | None = None  # None: never started here (or waiting for workers)
    waiting: Share | None = None  # a start or grow that found too few free workers: the share planned
    meter: WorkMeter | None = None  # base-batch-equivalent work, when it is metered
    refit: JobRefit | None = None  # its measured model; kept across a restart of the job
    launched_at: float | None = None  # epoch seconds it was first started (its wall split's start)
    result: JobResult | None = None  # what its ranks returned, once collected
    failure: str | None = None
    reported: bool = False  # its end (completed, failed, stopped, suspended) was told to the loop
    samples_before: float = 0.0  # a job started again after a stop: what its earlier run had trained
    preempted: bool = False  # its next stop is a preemption: checkpoint first (it resumes later)

    @property
    def live(self) -> bool:  # started, and its end neither reported nor failed
        return self.coordinator is not None and not self.reported and self.failure is None

    def share_now(self) -> Share | None:
        """What a live job trains on now (None: not started), the ``before`` of a retried grow."""
        job = self.coordinator
        if job is None or not self.live or not job.members:
            return None
        world = job.world_size
        return Share(world, max(job.global_batch, world))
