"""A one-shot plan: every job in a jobs file admitted at once, shares from a policy, with predictions.

Pure: used by ``malleable plan`` and by the plan flow to show what a policy would do. When any
job carries a noise scale the plan is on goodput physics (``allocator.physics.choice``): each job's
predicted runtime integrates its base-batch-equivalent work over its noise trajectory at the
planned share, T(B, k) E(B) on every piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from allocator.admission import OverflowMode, reallocate
from allocator.physics.goodput import base_batch, efficiency
from allocator.physics.choice import Physics, check_physics, physics_of
from allocator.policies.base import Policy
from allocator.physics.throughput import baseline_rate, throughput
from allocator.types import ClusterSnapshot, JobSpec, Share


@dataclass(frozen=True, slots=True)
class PlannedJob:
    job_id: str
    share: Share | None
    samples_per_s: float
    efficiency_vs_linear: float
    """samples/s divided by (GPUs x the job's one-GPU rate at its largest batch)."""
    predicted_runtime_s: float | None
    goodput_per_s: float = 0.0
    """Base-batch-equivalent samples/s at the job's start (samples_per_s x E(B)); = samples_per_s without a noise scale."""


@dataclass(frozen=True, slots=True)
class Plan:
    policy: str
    capacity: int
    jobs: tuple[PlannedJob, ...]
    waiting: tuple[str, ...]
    physics: Physics = Physics.THROUGHPUT

    @property
    def gpus_used(self) -> int:
        return sum(j.share.gpus for j in self.jobs if j.share is not None)


def _runtime(job: JobSpec, share: Share, rate: float) -> float | None:
    """Seconds to do the job's work at ``rate`` samples/s, each piece of its noise trajectory at E(B)."""
    if rate <= 0:
        return None
    if job.noise_scale is None:
        return job.total_samples / rate
    trajectory, b0 = job.noise_scale, base_batch(job)
    pieces = zip(trajectory.bounds, trajectory.bounds[1:], trajectory.values)
    return sum((hi - lo) * job.total_samples / (rate * float(efficiency(v, b0, share.global_batch))) for lo, hi, v in pieces)


def make_plan(jobs: Sequence[JobSpec], capacity: int, policy: Policy) -> Plan:
    """Admit jobs in arrival order while they fit (queue the rest), then allocate."""
    check_physics(policy, jobs)
    ordered = sorted(jobs, key=lambda j: (j.arrival_time, j.id))
    snapshot = ClusterSnapshot(time=0.0, capacity=capacity, queued=tuple(ordered))
    decision = reallocate(snapshot, policy, OverflowMode.QUEUE, strict_fifo=False)
    planned = []
    for job in ordered:
        share = decision.allocation.get(job.id)
        if share is None:
            continue
        rate = throughput(job.profile, share.global_batch, share.gpus, share.accum_steps)
        base = baseline_rate(job)
        planned.append(
            PlannedJob(
                job_id=job.id,
                share=share,
                samples_per_s=rate,
                efficiency_vs_linear=rate / (share.gpus * base) if base > 0 else 0.0,
                predicted_runtime_s=_runtime(job, share, rate),
                goodput_per_s=rate * (1.0 if job.noise_scale is None else float(efficiency(job.noise_scale.at(0.0), base_batch(job), share.global_batch))),
            )
        )
    return Plan(
        policy=policy.name,
        capacity=capacity,
        jobs=tuple(planned),
        waiting=tuple(j.id for j in decision.admission.queued),
        physics=physics_of(jobs),
    )
