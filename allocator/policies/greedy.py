"""Greedy GPU water-filling shared by the marginal-gain policies (seed 002 Elan, seed 004).

Every job starts at the fewest GPUs it can run on; then, one step at a time, the job whose
next step is worth most gets it, until GPUs run out or no job's next step clears the bar.
What "worth" means is the caller's ``gain`` function — the only thing the policies differ in.

A job whose next step fails the bar is frozen there: seed 004 keeps a job "at the point
before the conditions first begin to fail", and seed 002 stops when a job's gain is not
positive. Ties go to the job that comes first in the given order (running jobs, then the
queue in arrival order), so the answer is a pure function of the snapshot.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from allocator.policies.elastic_dp import job_table
from allocator.physics.throughput import RateTable
from allocator.types import Allocation, InfeasibleError, JobSpec, Share

# gain(job index, from k GPUs, to k2 GPUs) -> value per added GPU; compared with the bar.
Gain = Callable[[int, int, int], float]


@dataclass(frozen=True, slots=True)
class Tables:
    """Per job: its rate table over 0..kmax GPUs and the fewest GPUs it runs on."""

    jobs: tuple[JobSpec, ...]
    tables: tuple[RateTable, ...]
    minimum: tuple[int | None, ...]
    kmax: int

    def rate(self, index: int, gpus: int) -> float:
        return float(self.tables[index].rates[gpus])

    def share(self, index: int, gpus: int) -> Share:
        table = self.tables[index]
        return Share(gpus=gpus, global_batch=int(table.batches[gpus]), accum_steps=table.accum_steps(gpus))


def build_tables(jobs: Sequence[JobSpec], capacity: int) -> Tables:
    """Rate tables with batch following GPUs (b_opt(k)); non-elastic jobs pinned to their request."""
    kmax = max(1, min(capacity, max((j.max_gpus for j in jobs), default=1)))
    tables = tuple(job_table(job, kmax, None) for job in jobs)
    minimum = tuple(_first_feasible(t) for t in tables)
    return Tables(tuple(jobs), tables, minimum, kmax)


def _first_feasible(table: RateTable) -> int | None:
    feasible = table.feasible_counts()
    feasible = feasible[feasible >= 1]
    return int(feasible[0]) if feasible.size else None


def _next_count(table: RateTable, k: int, step: int, free: int) -> int | None:
    """The largest feasible count in (k, k + min(step, free)], or None if there is none."""
    hi = min(k + step, k + free, len(table.rates) - 1)
    for k2 in range(hi, k, -1):
        if math.isfinite(table.rates[k2]):
            return k2
    return None


def minimum_counts(t: Tables, capacity: int) -> list[int]:
    """Every job at its fewest GPUs; InfeasibleError if one cannot run or they do not all fit."""
    counts = []
    for job, need in zip(t.jobs, t.minimum):
        if need is None or need > capacity:
            raise InfeasibleError(f"job {job.id!r}: no GPU count in [{job.min_gpus}, {job.max_gpus}] fits its batch range on {capacity} GPUs")
        counts.append(need)
    total = sum(counts)
    if total > capacity:
        raise InfeasibleError(f"capacity={capacity}: the {len(counts)} jobs need at least {total} GPUs together")
    return counts


def grow(t: Tables, capacity: int, gain: Gain, bar: float, step: int = 1) -> list[int]:
    """Water-fill GPUs by ``gain`` from every job's minimum; a step is taken only if gain > bar."""
    counts = minimum_counts(t, capacity)
    free = capacity - sum(counts)
    heap: list[tuple[float, int, int]] = []

    def offer(i: int) -> None:
        if not t.jobs[i].elastic:
            return
        k2 = _next_count(t.tables[i], counts[i], step, free)
        if k2 is None:
            return
        value = gain(i, counts[i], k2)
        if value > bar:
            heapq.heappush(heap, (-value, i, k2))

    for i in range(len(counts)):
        offer(i)
    while heap and free > 0:
        _, i, k2 = heapq.heappop(heap)
        if k2 - counts[i] > free:
            offer(i)  # fewer GPUs left than the step: re-evaluate the smaller step
            continue
        free -= k2 - counts[i]
        counts[i] = k2
        offer(i)
    return counts


def to_allocation(t: Tables, counts: Sequence[int]) -> Allocation:
    return Allocation(tuple((job.id, t.share(i, k)) for i, (job, k) in enumerate(zip(t.jobs, counts))))


def finish_times(t: Tables, counts: Sequence[int], remaining: Sequence[float]) -> np.ndarray:
    """Seconds each job needs to finish its remaining samples at the given counts."""
    return np.array([rem / t.rate(i, k) for i, (k, rem) in enumerate(zip(counts, remaining))])
