"""Goodput-aware elastic policy: seed 000's DP over jobs x GPUs with goodput as the value.

For each job and GPU count k the batch (and the gradient-accumulation steps it needs) is
the one that maximises goodput(B, k) = T(B, k) E(B) at the job's current gradient noise
scale (``allocator.goodput``). A job's speedup on k GPUs is its best goodput there over its
best goodput on one GPU; the DP maximises the power mean of the speedups,
(1/J sum_j s_j^p)^(1/p), as Pollux does (OSDI'21, eq. 8): p = 1 is total normalised
goodput, p -> 0 the geometric mean, p < 0 favours the jobs that gain least (small jobs do not
starve). For a fixed J that is the separable sum of s^p (p > 0), log s (p = 0) or -s^p
(p < 0), which the DP maximises exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from allocator.goodput import GoodputTable, NoiseTrajectory, goodput_table
from allocator.policies.base import register
from allocator.policies.dp import solve_dp
from allocator.topology import gpus_per_host
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, Share


def fairness_value(speedup: np.ndarray, p: float) -> np.ndarray:
    """The per-job term whose sum the DP maximises for power-mean exponent ``p`` (-inf stays -inf)."""
    s = np.asarray(speedup, dtype=float)
    feasible = np.isfinite(s) & (s > 0)
    safe = np.where(feasible, s, 1.0)
    if p == 0:
        out = np.log(safe)
    elif p > 0:
        out = safe**p
    else:
        out = -(safe**p)
    return np.where(feasible, out, -np.inf)


@dataclass(frozen=True, slots=True)
class GoodputDP:
    """``noise`` maps a job id or a workload name to its B_noise trajectory; jobs in neither get
    ``default_noise_scale`` (inf: perfectly scalable, which reduces goodput to throughput).
    ``hosts`` is the GPUs per host when the snapshot carries no nodes (None: one flat network)."""

    noise: Mapping[str, NoiseTrajectory] = field(default_factory=dict)
    default_noise_scale: float = math.inf
    p: float = 1.0
    hosts: int | None = None
    name: str = "goodput_dp"

    def __post_init__(self) -> None:
        if not (isinstance(self.p, (int, float)) and math.isfinite(self.p)):
            raise ValueError(f"goodput_dp.p={self.p!r}: must be a finite number")
        if not (self.default_noise_scale > 0):
            raise ValueError(f"goodput_dp.default_noise_scale={self.default_noise_scale!r}: must be > 0")
        if self.hosts is not None and not (isinstance(self.hosts, int) and self.hosts >= 1):
            raise ValueError(f"goodput_dp.hosts={self.hosts!r}: must be a positive integer")
        for key, trajectory in self.noise.items():
            if not isinstance(trajectory, NoiseTrajectory):
                raise ValueError(f"goodput_dp.noise[{key!r}]={trajectory!r}: must be a NoiseTrajectory")

    def noise_scale(self, job: JobSpec, samples_done: float, reported: float | None = None) -> float:
        """The job's own reported B_noise if the snapshot has one, else its trajectory, else the default."""
        if reported is not None:
            return reported
        trajectory = self.noise.get(job.id) or self.noise.get(job.workload)
        if trajectory is None:
            return self.default_noise_scale
        return trajectory.at(samples_done / job.total_samples)

    def tables(
        self, job: JobSpec, kmax: int, samples_done: float, per_host: int | None, reported: float | None = None
    ) -> tuple[GoodputTable, float]:
        """The job's goodput table and its one-GPU goodput (the speedup's denominator)."""
        noise = self.noise_scale(job, samples_done, reported)
        table = goodput_table(job, kmax, noise, gpus_per_host=per_host)
        one = goodput_table(job, 1, noise, gpus_per_host=per_host, limit_gpus=False).goodput[1]
        return table, float(one)

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        jobs = snapshot.jobs
        if not jobs:
            return Allocation()
        kmax = min(snapshot.capacity, max(j.max_gpus for j in jobs))
        if kmax < 1:
            raise InfeasibleError(f"capacity={snapshot.capacity}: no GPU to give")
        per_host = gpus_per_host(snapshot) or self.hosts
        done = {r.spec.id: r.samples_done for r in snapshot.running}
        reported = {r.spec.id: r.noise_scale for r in snapshot.running}
        tables = [self.tables(j, kmax, done.get(j.id, 0.0), per_host, reported.get(j.id)) for j in jobs]
        values = np.stack([fairness_value(t.goodput / one, self.p) for t, one in tables])
        counts, _ = solve_dp(values, snapshot.capacity)
        return Allocation(
            tuple(
                (j.id, Share(gpus=int(k), batch=int(t.batches[k]), accum_steps=int(t.accum[k])))
                for j, (t, _), k in zip(jobs, tables, counts)
            )
        )

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None:
        kmax = min(capacity, job.max_gpus)
        if kmax < 1:
            return None
        feasible = self.tables(job, kmax, 0.0, self.hosts)[0].feasible_counts()
        return int(feasible[0]) if feasible.size else None


@register("goodput_dp")
def _make(
    noise: Mapping[str, NoiseTrajectory] | None = None,
    default_noise_scale: float = math.inf,
    p: float = 1.0,
    hosts: int | None = None,
) -> GoodputDP:
    return GoodputDP(noise=dict(noise or {}), default_noise_scale=float(default_noise_scale), p=float(p), hosts=hosts)
