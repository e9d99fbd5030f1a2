"""A workload's measured speed: per-iteration time against per-GPU batch, and the allreduce fit."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from allocator.checks import MAX_BATCH, finite_nonneg, positive_int, require
from allocator.physics.noise import NoiseTrajectory


@dataclass(frozen=True, slots=True)
class AllreduceModel:
    """Ring-allreduce time for p parameters over k workers.

    t_comm(p, k) = 2 (k - 1) * latency_s + 2 (k - 1) / k * p * seconds_per_param, and 0 for k = 1.
    ``seconds_per_param`` folds bytes per parameter and link bandwidth together; both
    coefficients come from a least-squares fit of measured allreduce times.
    """

    latency_s: float = 0.0
    seconds_per_param: float = 0.0

    def __post_init__(self) -> None:
        finite_nonneg("AllreduceModel", "latency_s", self.latency_s)
        finite_nonneg("AllreduceModel", "seconds_per_param", self.seconds_per_param)


@dataclass(frozen=True, slots=True)
class ThroughputProfile:
    """Measured per-iteration time on one GPU against per-GPU batch, plus an allreduce fit.

    ``batch_sizes`` are per-GPU batch sizes, strictly increasing; ``iter_times_s`` the
    matching forward+backward+step times, non-decreasing (a larger batch never takes less
    time — anything else is a measurement error we refuse rather than interpolate).
    ``max_batch_per_gpu`` is the memory cap: the largest per-GPU batch that fits.
    ``inter_host`` optionally fits allreduce across hosts separately (``allreduce`` then
    holds the intra-host fit); None: one fit for both. ``noise_scale``, when measured with the
    profile (``malleable profile --noise``), is the gradient noise scale over the fraction of
    work done that jobs using this profile take unless they give their own. ``overlap`` (γ >= 1)
    says how much of the allreduce hides behind the backward pass: a step takes
    (t_proc^γ + t_comm^γ)^(1/γ), Pollux's model (OSDI'21, its ``PerfParams.gamma``); 1 (the
    default) adds them, no overlap; a large γ approaches max(t_proc, t_comm).
    """

    workload: str
    num_params: int
    batch_sizes: tuple[int, ...]
    iter_times_s: tuple[float, ...]
    max_batch_per_gpu: int
    allreduce: AllreduceModel = field(default_factory=AllreduceModel)
    hardware: str = "unknown"
    inter_host: AllreduceModel | None = None
    noise_scale: NoiseTrajectory | None = None
    overlap: float = 1.0

    def __post_init__(self) -> None:
        owner = f"ThroughputProfile[{self.workload}]"
        require(
            isinstance(self.overlap, (int, float)) and not isinstance(self.overlap, bool) and math.isfinite(self.overlap) and self.overlap >= 1,
            owner, "overlap", self.overlap, "must be a finite number >= 1 (1: compute and allreduce add up)",
        )  # fmt: skip
        require(isinstance(self.workload, str) and self.workload != "", owner, "workload", self.workload, "must be a non-empty string")
        positive_int(owner, "num_params", self.num_params)
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        object.__setattr__(self, "iter_times_s", tuple(float(t) for t in self.iter_times_s))
        require(len(self.batch_sizes) > 0, owner, "batch_sizes", self.batch_sizes, "profile is empty: need at least one measured point")
        require(
            len(self.batch_sizes) == len(self.iter_times_s),
            owner,
            "iter_times_s",
            self.iter_times_s,
            f"has {len(self.iter_times_s)} values for {len(self.batch_sizes)} batch sizes",
        )
        for b in self.batch_sizes:
            positive_int(owner, "batch_sizes", b)
        for t in self.iter_times_s:
            require(math.isfinite(t) and t > 0, owner, "iter_times_s", self.iter_times_s, "every time must be finite and > 0")
        for a, b in zip(self.batch_sizes, self.batch_sizes[1:]):
            require(b > a, owner, "batch_sizes", self.batch_sizes, "must be strictly increasing")
        for i, (a, b) in enumerate(zip(self.iter_times_s, self.iter_times_s[1:]), start=1):
            require(
                b >= a,
                owner,
                f"iter_times_s[{i}]",
                b,
                f"at batch {self.batch_sizes[i]} is below iter_times_s[{i - 1}]={a!r} at batch {self.batch_sizes[i - 1]}; "
                "times must be non-decreasing in batch size (a non-monotone profile; for measured noise use the monotone envelope)",
            )
        positive_int(owner, "max_batch_per_gpu", self.max_batch_per_gpu)
        require(self.max_batch_per_gpu <= MAX_BATCH, owner, "max_batch_per_gpu", self.max_batch_per_gpu, f"must be <= {MAX_BATCH:,} (MAX_BATCH)")
        require(isinstance(self.allreduce, AllreduceModel), owner, "allreduce", self.allreduce, "must be an AllreduceModel")
        require(
            self.inter_host is None or isinstance(self.inter_host, AllreduceModel), owner, "inter_host", self.inter_host, "must be an AllreduceModel or None"
        )
        require(
            self.noise_scale is None or isinstance(self.noise_scale, NoiseTrajectory), owner, "noise_scale", self.noise_scale, "must be a NoiseTrajectory or None"
        )
