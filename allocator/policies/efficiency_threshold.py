"""Seed 004 (Or et al.): grow a job while adding workers is efficient enough, shrink otherwise.

What the paper says (Section 4): add K workers every N batches while a scaling condition
holds; when it fails, settle "at the point before the conditions first begin to fail"
(searching downwards if even the current size is inefficient). Two conditions:

* throughput scaling efficiency ``s_{k,d} = ((R_{k+d} - R_k) / d) / (R_k / k) > S``, with
  S in [0, 1] (0.1 in their experiments) — what the d new workers add, relative to what
  each existing worker contributes;
* utility vs cost, when the user prices things: add workers while the marginal utility
  beats the marginal cost, ``U(T(k+d)) - U(T(k)) > C(k+d) - C(k)``, with
  ``C = C_p + t_k * b * k * P`` and ``T = T_p + t_k * b``; it overrides the throughput
  condition.

What we do:

* The paper discovers R_k online because it has no model; we have the throughput model,
  so the settled size is computed directly from the rate table: from the job's minimum,
  take steps of ``step`` GPUs (their K; 1 by default) while the condition holds and stop at
  the first step that fails. The search the paper walks over minutes, we do in one call;
  re-allocating from the same state gives the same size, and a job above its settled size
  (e.g. one the cluster grew earlier) is shrunk back to it.
* Several jobs share the cluster (the paper autoscales one job): all start at their
  minimum and the free GPUs go one step at a time to the job whose next step scores
  highest (efficiency, or net utility per GPU), while it clears the condition. When GPUs
  run out before a job settles, it stops short; fewer GPUs than a step left means a
  smaller step. Ties go to the earlier job.
* Utility is linear, ``U(T) = U_0 - utility_per_s * T`` (their Fig. 5a), and the price is
  ``price_per_gpu_s``; with remaining samples ``n`` and throughput ``R_k`` the condition is
  ``utility_per_s * n (1/R_k - 1/R_{k+d}) > price_per_gpu_s * n ((k+d)/R_{k+d} - k/R_k)``.
  Step utilities and per-job utilities are not modelled.
* Batch follows GPUs (b_opt(k) from ``rate_table``, within the job's batch range and memory
  cap), where the paper fixes the local batch until the user's global maximum: both grow
  the global batch with k; ours also picks the best per-GPU size. Non-elastic jobs keep
  their requested GPUs and fixed batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from allocator.policies.base import register
from allocator.policies.elan_fifo import remaining_of
from allocator.policies.elastic_dp import fewest_gpus
from allocator.policies.greedy import Gain, Tables, build_tables, grow, to_allocation
from allocator.types import Allocation, ClusterSnapshot, JobSpec


def scaling_efficiency(r_k: float, r_k2: float, k: int, k2: int) -> float:
    """Seed 004's s_{k,d}: per-GPU gain of the d = k2 - k new GPUs relative to each existing one's rate."""
    return ((r_k2 - r_k) / (k2 - k)) / (r_k / k)


def efficiency_gain(t: Tables) -> Gain:
    def gain(i: int, k: int, k2: int) -> float:
        return scaling_efficiency(t.rate(i, k), t.rate(i, k2), k, k2)

    return gain


def utility_gain(t: Tables, remaining: Sequence[float], utility_per_s: float, price_per_gpu_s: float) -> Gain:
    """Marginal utility minus marginal cost of going from k to k2 GPUs, per added GPU."""

    def gain(i: int, k: int, k2: int) -> float:
        n, r_k, r_k2 = remaining[i], t.rate(i, k), t.rate(i, k2)
        utility = utility_per_s * n * (1.0 / r_k - 1.0 / r_k2)
        cost = price_per_gpu_s * n * (k2 / r_k2 - k / r_k)
        return (utility - cost) / (k2 - k)

    return gain


@dataclass(frozen=True, slots=True)
class EfficiencyThreshold:
    threshold: float = 0.1
    step: int = 1
    utility_per_s: float | None = None
    price_per_gpu_s: float | None = None
    name: str = "efficiency_threshold"

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, (int, float)) and 0.0 <= self.threshold <= 1.0):
            raise ValueError(f"threshold={self.threshold!r}: must be a number in [0, 1] (seed 004's S)")
        if not (isinstance(self.step, int) and not isinstance(self.step, bool) and self.step >= 1):
            raise ValueError(f"step={self.step!r}: must be a positive integer (GPUs added per scaling step)")
        if (self.utility_per_s is None) != (self.price_per_gpu_s is None):
            raise ValueError(
                f"utility_per_s={self.utility_per_s!r}, price_per_gpu_s={self.price_per_gpu_s!r}: give both or neither"
            )
        for field_name in ("utility_per_s", "price_per_gpu_s"):
            value = getattr(self, field_name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{field_name}={value!r}: must be a finite number >= 0")

    @property
    def uses_utility(self) -> bool:
        return self.utility_per_s is not None

    def counts(self, jobs: Sequence[JobSpec], remaining: Sequence[float], capacity: int) -> tuple[Tables, list[int]]:
        t = build_tables(jobs, capacity)
        if self.uses_utility:
            gain = utility_gain(t, remaining, float(self.utility_per_s), float(self.price_per_gpu_s))  # type: ignore[arg-type]
            return t, grow(t, capacity, gain, bar=0.0, step=self.step)
        return t, grow(t, capacity, efficiency_gain(t), bar=float(self.threshold), step=self.step)

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        jobs = snapshot.jobs
        if not jobs:
            return Allocation()
        left = remaining_of(snapshot)
        t, counts = self.counts(jobs, [left[j.id] for j in jobs], snapshot.capacity)
        return to_allocation(t, counts)

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None:
        return fewest_gpus(job, capacity, None)


def _number(name: str, value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: must be a number") from None


@register("efficiency_threshold")
def _make(
    threshold: object = 0.1, step: object = 1, utility_per_s: object = None, price_per_gpu_s: object = None
) -> EfficiencyThreshold:
    if isinstance(step, str) and step.strip().isdigit():
        step = int(step)
    return EfficiencyThreshold(
        threshold=_number("threshold", threshold),
        step=step,  # type: ignore[arg-type]
        utility_per_s=None if utility_per_s is None else _number("utility_per_s", utility_per_s),
        price_per_gpu_s=None if price_per_gpu_s is None else _number("price_per_gpu_s", price_per_gpu_s),
    )
