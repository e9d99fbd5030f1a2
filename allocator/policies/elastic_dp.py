"""Seed 000's elastic policy: GPUs and batch size per job by dynamic programming.

Each job's value for k GPUs is its throughput scaling factor T_j(b_opt(k), k) / T_j(b_max, 1)
(eq. 1-3); the DP maximises their sum. Non-elastic jobs only have a value at their
requested GPU count with their fixed batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from allocator.policies.base import register
from allocator.policies.dp import solve_dp
from allocator.physics.throughput import RateTable, baseline_rate, rate_table, throughput
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, Share


def job_table(job: JobSpec, kmax: int, fixed_batch: int | None) -> RateTable:
    """The rate table a job contributes: elastic jobs choose batch and GPUs, others are pinned.

    A pinned batch that exceeds k x the memory cap runs with gradient accumulation (as the
    trainer does) rather than forcing the job onto more GPUs.
    """
    if not job.elastic:
        table = rate_table(job, kmax, batch=job.batch_when_fixed, accumulate=True)
        rates = np.full(kmax + 1, -np.inf)
        if job.requested_gpus <= kmax:
            rates[job.requested_gpus] = table.rates[job.requested_gpus]
        return RateTable(table.batches, rates, table.accum)
    return rate_table(job, kmax, batch=fixed_batch, accumulate=fixed_batch is not None)


def normaliser(job: JobSpec, fixed_batch: int | None) -> float:
    """Seed 000's T_j(b_max, 1). With the batch pinned (fixed-batch baselines) the range is that
    one batch, so b_max is it: a job's max_batch must not weigh a batch it never runs."""
    if fixed_batch is None:
        return baseline_rate(job)
    return throughput(job.profile, min(job.profile.max_batch_per_gpu, fixed_batch), 1)


def allocate_by_dp(jobs: Sequence[JobSpec], capacity: int, batches: Sequence[int | None]) -> Allocation:
    """Build the value matrix, solve, and turn counts into shares (shared by the DP-based policies)."""
    if not jobs:
        return Allocation()
    kmax = min(capacity, max(j.max_gpus for j in jobs))
    if kmax < 1:
        raise InfeasibleError(f"capacity={capacity}: no GPU to give")
    tables = [job_table(job, kmax, b) for job, b in zip(jobs, batches)]
    values = np.empty((len(jobs), kmax + 1))
    for row, (job, table, b) in enumerate(zip(jobs, tables, batches)):
        values[row] = table.rates / normaliser(job, b)
    counts, _ = solve_dp(values, capacity)
    return Allocation(
        tuple(
            (job.id, Share(gpus=int(k), global_batch=int(t.batches[k]), accum_steps=t.accum_steps(int(k))))
            for job, t, k in zip(jobs, tables, counts)
        )
    )


def fewest_gpus(job: JobSpec, capacity: int, fixed_batch: int | None) -> int | None:
    kmax = min(capacity, job.max_gpus)
    if kmax < 1:
        return None
    feasible = job_table(job, kmax, fixed_batch).feasible_counts()
    return int(feasible[0]) if feasible.size else None


@dataclass(frozen=True, slots=True)
class ElasticDP:
    name: str = "elastic_dp"

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        jobs = snapshot.jobs
        return allocate_by_dp(jobs, snapshot.capacity, [None] * len(jobs))

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None:
        return fewest_gpus(job, capacity, None)


@register("elastic_dp")
def _make(**params: object) -> ElasticDP:
    if params:
        raise ValueError(f"policy elastic_dp takes no parameters, got {sorted(params)}")
    return ElasticDP()
