"""Seed 000's baselines: the global batch never changes.

* ``fixed_batch`` — the weak baseline: fixed batch *and* fixed GPU count (the job's
  ``requested_gpus``), first come first served with backfill: a queued job that does not
  fit waits without blocking later jobs that do, as batch schedulers run in practice.
  ``strict_fifo=True`` makes it block them (one job asking for most of the cluster then
  holds up the whole queue — a strawman, not a baseline to compare an elastic policy with).
* ``fixed_batch_dp`` — the paper's stronger baseline (Section IV-B): fixed global batch,
  GPU count chosen by the same DP as the elastic policy.

Which fixed batch: the job's own ``fixed_batch`` if it gives one, else per ``batch_choice``:
``max``, ``min`` or ``random`` (uniform in the job's range, drawn from the job id and
``seed`` so a job keeps its draw across re-allocations and runs).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from enum import Enum

import numpy as np

from allocator.admission import admit_in_order
from allocator.policies.base import register
from allocator.protocols import AdmissionDecision, OverflowMode
from allocator.policies.elastic_dp import allocate_by_dp, fewest_gpus, job_table
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, Share


class BatchChoice(str, Enum):
    MAX = "max"
    MIN = "min"
    RANDOM = "random"


def chosen_batch(job: JobSpec, choice: BatchChoice, seed: int) -> int:
    if job.fixed_batch is not None:
        return job.fixed_batch
    if choice is BatchChoice.MAX:
        return job.max_batch
    if choice is BatchChoice.MIN:
        return job.min_batch
    rng = np.random.default_rng([seed, zlib.crc32(job.id.encode())])
    return int(rng.integers(job.min_batch, job.max_batch + 1))


def _parse_choice(value: object) -> BatchChoice:
    try:
        return BatchChoice(value)
    except ValueError:
        raise ValueError(f"batch_choice={value!r}: choose one of max, min, random") from None


@dataclass(frozen=True, slots=True)
class FixedBatchFCFS:
    batch_choice: BatchChoice = BatchChoice.MAX
    seed: int = 0
    strict_fifo: bool = False
    name: str = "fixed_batch"

    def admit(self, snapshot: ClusterSnapshot, mode: OverflowMode) -> AdmissionDecision:
        """Arrival order; with backfill unless ``strict_fifo`` (its own rule, whatever the loop's)."""
        return admit_in_order(snapshot, self, mode, self.strict_fifo)

    def _gpus(self, job: JobSpec, capacity: int) -> int | None:
        """The requested count, raised to the fewest GPUs the fixed batch fits on; None if neither fits."""
        kmax = min(capacity, job.max_gpus)
        need = fewest_gpus(job, capacity, chosen_batch(job, self.batch_choice, self.seed))
        if need is None:
            return None
        gpus = max(need, job.requested_gpus)
        table = job_table(job, kmax, chosen_batch(job, self.batch_choice, self.seed)) if gpus <= kmax else None
        return gpus if table is not None and np.isfinite(table.rates[gpus]) else None

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        free = snapshot.capacity
        shares = []
        for job in snapshot.jobs:  # running first, then the queue in arrival order
            current = snapshot.current_share(job.id)
            batch = chosen_batch(job, self.batch_choice, self.seed)
            gpus = current.gpus if current is not None else self._gpus(job, snapshot.capacity)
            if gpus is None or gpus > free:
                raise InfeasibleError(f"job {job.id!r} needs {gpus} GPUs with batch {batch}; {free} free")
            table = job_table(job, snapshot.capacity, batch)
            shares.append((job.id, Share(gpus=gpus, global_batch=int(table.batches[gpus]), accum_steps=table.accum_steps(gpus))))
            free -= gpus
        return Allocation(tuple(shares))

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None:
        return self._gpus(job, capacity)


@dataclass(frozen=True, slots=True)
class FixedBatchDP:
    batch_choice: BatchChoice = BatchChoice.MAX
    seed: int = 0
    name: str = "fixed_batch_dp"

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        jobs = snapshot.jobs
        batches = [chosen_batch(j, self.batch_choice, self.seed) for j in jobs]
        return allocate_by_dp(jobs, snapshot.capacity, batches)

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None:
        return fewest_gpus(job, capacity, chosen_batch(job, self.batch_choice, self.seed))


@register("fixed_batch")
def _make_fcfs(batch_choice: object = "max", seed: int = 0, strict_fifo: object = False) -> FixedBatchFCFS:
    if not isinstance(strict_fifo, bool):
        raise ValueError(f"strict_fifo={strict_fifo!r}: must be true or false")
    return FixedBatchFCFS(batch_choice=_parse_choice(batch_choice), seed=int(seed), strict_fifo=strict_fifo)


@register("fixed_batch_dp")
def _make_dp(batch_choice: object = "max", seed: int = 0) -> FixedBatchDP:
    return FixedBatchDP(batch_choice=_parse_choice(batch_choice), seed=int(seed))
