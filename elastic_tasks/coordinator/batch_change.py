"""A batch-only change: same ranks, same process group, another global batch from a step boundary on.

Hybrid scaling changes the batch with the GPUs, but a goodput policy also changes it alone as
a job's gradient noise scale grows (Pollux). Such a change needs no regroup: the coordinator
publishes a ``BATCH`` plan with the same members; at the agreed step boundary every rank
settles its last agreement, moves its learning rate along the progressive rule, reopens its
data stream at the new batch (accumulation follows from the batch and the memory cap) and
trains on in the same process group. The pause it reports is that switch alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elastic_tasks.coordinator.lifecycle import CoordinatorState
from elastic_tasks.coordinator.outcomes import RescaleOutcome
from elastic_tasks.protocol import Plan, PlanKind, check_batch

if TYPE_CHECKING:
    from elastic_tasks.coordinator.job import JobCoordinator


def change_batch(job: JobCoordinator, global_batch: int, at_step: int | None = None, accum_steps: int | None = None) -> RescaleOutcome | None:
    """Switch ``job`` to ``global_batch`` (and ``accum_steps``) on its current ranks; blocks until they train on it.

    None when there is nothing to change or the job ended before the ranks reached the switch.
    """
    with job.plan_lock:
        members = job.members
        check_batch(global_batch, len(members))
        if global_batch == job.global_batch and accum_steps == job.accum_steps:
            return None
        job.lifecycle.move(CoordinatorState.RESCALING)
        version = job.next_version()
        job.publish(Plan(version, PlanKind.BATCH, members, global_batch, at_step=at_step, accum_steps=accum_steps))
    # Outside the plan lock: a failure meanwhile must be able to start recovery.
    event = job.wait_applied(version, job.startup_s + job.eta_s(at_step))
    job.lifecycle.move(CoordinatorState.RUNNING, only_from=(CoordinatorState.RESCALING,))
    if event is None or event.version != version:  # the job ended, or a recovery replaced the generation
        return None
    with job.plan_lock:
        job.global_batch, job.accum_steps = global_batch, accum_steps
    outcome = RescaleOutcome(version, PlanKind.BATCH, len(members), len(members), global_batch, event.step, event.pause_s, 0.0)
    job.rescales.append(outcome)
    return outcome
