"""Seed 000's arrival patterns: Poisson processes at low, high or alternating (bursty) rates.

Base rate λ = the expected completion rate of one job drawn uniformly from the categories,
run on one GPU at its largest batch: λ = 1 / mean(single-GPU minutes). High = kmax·λ,
low = λ / kmax; bursty alternates high and low every ``period_min`` minutes, starting high.
``scale`` multiplies every rate (e.g. GPUs / 40 to keep a bigger cluster as busy).
All randomness comes from the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from allocator.types import JobSpec
from allocator.workloads.seed000 import CATEGORIES, Category, make_job
from allocator.types import ThroughputProfile


class Pattern(str, Enum):
    LOW = "low"
    HIGH = "high"
    BURSTY = "bursty"


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    pattern: Pattern
    horizon_min: float = 240.0
    kmax: int = 10
    period_min: float = 60.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", Pattern(self.pattern))
        if not self.horizon_min > 0:
            raise ValueError(f"ArrivalSpec.horizon_min={self.horizon_min!r}: must be > 0")
        if not (isinstance(self.kmax, int) and self.kmax >= 1):
            raise ValueError(f"ArrivalSpec.kmax={self.kmax!r}: must be an integer >= 1")
        if not self.period_min > 0:
            raise ValueError(f"ArrivalSpec.period_min={self.period_min!r}: must be > 0")
        if not self.scale > 0:
            raise ValueError(f"ArrivalSpec.scale={self.scale!r}: must be > 0")


def base_rate_per_min(categories: tuple[Category, ...] = CATEGORIES) -> float:
    return 1.0 / float(np.mean([c.single_gpu_minutes for c in categories]))


def rate_segments(spec: ArrivalSpec, base: float) -> list[tuple[float, float, float]]:
    """(start_min, end_min, jobs per minute) pieces covering the horizon."""
    high, low = spec.kmax * base * spec.scale, base / spec.kmax * spec.scale
    if spec.pattern is Pattern.HIGH:
        return [(0.0, spec.horizon_min, high)]
    if spec.pattern is Pattern.LOW:
        return [(0.0, spec.horizon_min, low)]
    segments, t, is_high = [], 0.0, True
    while t < spec.horizon_min:
        end = min(t + spec.period_min, spec.horizon_min)
        segments.append((t, end, high if is_high else low))
        t, is_high = end, not is_high
    return segments


def arrival_times_min(spec: ArrivalSpec, rng: np.random.Generator, base: float | None = None) -> np.ndarray:
    """Poisson arrivals; restarting the exponential clock at each rate change is exact (memoryless)."""
    times: list[float] = []
    for start, end, rate in rate_segments(spec, base if base is not None else base_rate_per_min()):
        t = start
        while True:
            t += rng.exponential(1.0 / rate)
            if t >= end:
                break
            times.append(t)
    return np.asarray(times)


def generate_jobs(
    spec: ArrivalSpec,
    profiles: dict[int, ThroughputProfile],
    rng: np.random.Generator,
    categories: tuple[int, ...] = (1, 2, 3, 4),
    max_gpus: int | None = None,
) -> list[JobSpec]:
    """Jobs arriving per ``spec``, each of a category drawn uniformly from ``categories``."""
    chosen = tuple(c for c in CATEGORIES if c.number in categories)
    if not chosen:
        raise ValueError(f"categories={categories!r}: choose among 1-4")
    times = arrival_times_min(spec, rng, base_rate_per_min(chosen))
    picks = rng.integers(0, len(chosen), size=len(times))
    return [
        make_job(f"job-{i:05d}", chosen[p], profiles[chosen[p].number], float(t) * 60.0, max_gpus or spec.kmax)
        for i, (t, p) in enumerate(zip(times, picks))
    ]
