"""A job's life as everyone above the coordinator names it: the loop, the service's store, the CLI.

One vocabulary for one job: the loop reports its transitions in it (``JobTransition``), the
service stores it as is, and the executor's jobs are told apart by it. ``SUSPENDED`` is the one
state the loop itself never enters: a service that stops checkpoints its running jobs and
leaves them so, for the next service to take up. The coordinator's own, finer state of one
job's generations (starting, rescaling, recovering...) is a different thing and has its own
name: ``elastic_tasks.coordinator.lifecycle.CoordinatorState``.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    QUEUED = "queued"  # submitted, waiting for GPUs
    RUNNING = "running"
    SUSPENDED = "suspended"  # checkpointed and stopped by a service shutdown; resumes when one starts
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DROPPED = "dropped"  # can never fit the cluster

    @property
    def terminal(self) -> bool:
        return self in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED, JobState.DROPPED)
