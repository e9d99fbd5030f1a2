"""A one-shot plan: every job in a jobs file admitted at once, shares from a policy, with predictions.

Pure: used by ``malleable plan`` and by the plan flow to show what a policy would do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from allocator.admission import OverflowMode, reallocate
from allocator.policies.base import Policy
from allocator.throughput import baseline_rate, throughput
from allocator.types import ClusterSnapshot, JobSpec, Share


@dataclass(frozen=True, slots=True)
class PlannedJob:
    job_id: str
    share: Share | None
    samples_per_s: float
    efficiency_vs_linear: float
    """samples/s divided by (GPUs x the job's one-GPU rate at its largest batch)."""
    predicted_runtime_s: float | None


@dataclass(frozen=True, slots=True)
class Plan:
    policy: str
    capacity: int
    jobs: tuple[PlannedJob, ...]
    waiting: tuple[str, ...]

    @property
    def gpus_used(self) -> int:
        return sum(j.share.gpus for j in self.jobs if j.share is not None)


def make_plan(jobs: Sequence[JobSpec], capacity: int, policy: Policy) -> Plan:
    """Admit jobs in arrival order while they fit (queue the rest), then allocate."""
    ordered = sorted(jobs, key=lambda j: (j.arrival_time, j.id))
    snapshot = ClusterSnapshot(time=0.0, capacity=capacity, queued=tuple(ordered))
    decision = reallocate(snapshot, policy, OverflowMode.QUEUE, strict_fifo=False)
    planned = []
    for job in ordered:
        share = decision.allocation.get(job.id)
        if share is None:
            continue
        rate = throughput(job.profile, share.batch, share.gpus, share.accum_steps)
        base = baseline_rate(job)
        planned.append(
            PlannedJob(
                job_id=job.id,
                share=share,
                samples_per_s=rate,
                efficiency_vs_linear=rate / (share.gpus * base) if base > 0 else 0.0,
                predicted_runtime_s=job.total_samples / rate if rate > 0 else None,
            )
        )
    return Plan(
        policy=policy.name,
        capacity=capacity,
        jobs=tuple(planned),
        waiting=tuple(j.id for j in decision.admission.queued),
    )
