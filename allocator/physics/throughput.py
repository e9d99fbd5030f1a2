"""Seed 000's throughput model: T(b, k) = b / (t_proc(ceil(b / k)) (+) t_comm(p, k)).

t_proc comes from a job's measured one-GPU points (interpolated, extrapolated up to the
memory cap), t_comm from a ring-allreduce fit; (+) is ``last_micro_step``: a plain sum unless
the profile says the allreduce overlaps the backward pass (``ThroughputProfile.overlap``).
``rate_table`` gives, for every GPU count, the best global batch and its samples/s — what
every policy consumes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from allocator.types import AllreduceModel, JobSpec, ThroughputProfile


def t_proc(profile: ThroughputProfile, batch_per_gpu: float | np.ndarray) -> float | np.ndarray:
    """Per-iteration time on one GPU for a per-GPU batch; inf beyond the memory cap.

    Between measured points: linear interpolation. Above the last point (up to the cap):
    the last segment's slope, which is how a saturated GPU behaves. Below the first: the
    first segment's slope, but never faster per sample than the first point — small
    batches only lose efficiency.
    """
    b = np.asarray(batch_per_gpu, dtype=float)
    xs = np.asarray(profile.batch_sizes, dtype=float)
    ts = np.asarray(profile.iter_times_s, dtype=float)
    if len(xs) == 1:
        out = ts[0] * b / xs[0]
    else:
        out = np.interp(b, xs, ts)
        hi_slope = (ts[-1] - ts[-2]) / (xs[-1] - xs[-2])
        lo_slope = (ts[1] - ts[0]) / (xs[1] - xs[0])
        out = np.where(b > xs[-1], ts[-1] + hi_slope * (b - xs[-1]), out)
        below = np.maximum(ts[0] - lo_slope * (xs[0] - b), ts[0] * b / xs[0])
        out = np.where(b < xs[0], below, out)
    out = np.where((b > profile.max_batch_per_gpu) | (b <= 0), np.inf, out)
    return float(out) if out.ndim == 0 else out


def t_comm(model: AllreduceModel, num_params: int, gpus: int | np.ndarray) -> float | np.ndarray:
    """Ring allreduce: 2(k-1) latency hops and 2(k-1)/k of the buffer over each link; 0 for k=1."""
    k = np.asarray(gpus, dtype=float)
    out = np.where(
        k > 1,
        2.0 * (k - 1.0) * model.latency_s + 2.0 * (k - 1.0) / np.maximum(k, 1.0) * num_params * model.seconds_per_param,
        0.0,
    )
    return float(out) if out.ndim == 0 else out


def last_micro_step(compute: float | np.ndarray, comm: float | np.ndarray, overlap: float) -> float | np.ndarray:
    """The micro-step that ends in the allreduce: (compute^γ + comm^γ)^(1/γ), γ = ``overlap``.

    Pollux's step-time model (OSDI'21, goodput.py's ``_predict_log_optim_time``): buckets of
    gradients are reduced while the backward pass still runs, so the allreduce partly hides
    behind compute. γ = 1: no overlap (the sum); γ -> inf: full overlap (the max).
    """
    if overlap == 1.0:
        return compute + comm
    c, n = np.asarray(compute, dtype=float), np.asarray(comm, dtype=float)
    top = np.maximum(c, n)
    # Scaled by the larger term so large γ does not overflow; inf compute stays inf.
    safe = np.where(np.isfinite(top) & (top > 0), top, 1.0)
    out = np.where(np.isfinite(top) & (top > 0), safe * ((c / safe) ** overlap + (n / safe) ** overlap) ** (1.0 / overlap), top)
    return float(out) if out.ndim == 0 else out


def fit_allreduce(measurements: Sequence[tuple[int, int, float]]) -> AllreduceModel:
    """Least-squares fit of the ring model to (params, gpus, seconds) measurements.

    Coefficients are kept non-negative: if the unconstrained fit makes one negative, that
    term is dropped and the other refitted alone (a two-variable NNLS). Points with k = 1
    carry no information about either term and are ignored.
    """
    rows = [(p, k, t) for p, k, t in measurements if k > 1]
    if not rows:
        return AllreduceModel()
    a = np.array([[2.0 * (k - 1), 2.0 * (k - 1) / k * p] for p, k, _ in rows])
    y = np.array([t for _, _, t in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    if coef[0] < 0 or coef[1] < 0:
        candidates = []
        for col in (0, 1):
            x = a[:, col]
            c = max(0.0, float(x @ y / (x @ x))) if x @ x > 0 else 0.0
            pair = (c, 0.0) if col == 0 else (0.0, c)
            candidates.append((float(np.sum((a @ np.array(pair) - y) ** 2)), pair))
        coef = np.array(min(candidates)[1])
    return AllreduceModel(latency_s=float(coef[0]), seconds_per_param=float(coef[1]))


def _t_proc_scalar(profile: ThroughputProfile, b: int) -> float:
    """``t_proc`` for one batch size in plain Python: the simulator asks this per rescale."""
    if b > profile.max_batch_per_gpu or b <= 0:
        return math.inf
    xs, ts = profile.batch_sizes, profile.iter_times_s
    if len(xs) == 1:
        return ts[0] * b / xs[0]
    if b >= xs[-1]:
        return ts[-1] + (ts[-1] - ts[-2]) / (xs[-1] - xs[-2]) * (b - xs[-1])
    if b < xs[0]:
        return max(ts[0] - (ts[1] - ts[0]) / (xs[1] - xs[0]) * (xs[0] - b), ts[0] * b / xs[0])
    i = bisect.bisect_right(xs, b) - 1
    return ts[i] + (ts[i + 1] - ts[i]) * (b - xs[i]) / (xs[i + 1] - xs[i])


def throughput(profile: ThroughputProfile, batch: int, gpus: int, accum_steps: int = 1) -> float:
    """Samples per second for a global batch on ``gpus`` GPUs (0 if it does not fit).

    With ``accum_steps`` > 1 each rank runs that many forward/backward passes of
    ceil(batch / (gpus * accum_steps)) samples before one allreduce, which overlaps the last:
    step = (accum_steps - 1) t_proc(micro) + last_micro_step(t_proc(micro), t_comm(p, k)).
    """
    if gpus < 1 or accum_steps < 1 or batch < gpus * accum_steps:
        return 0.0
    comm = 0.0
    if gpus > 1:
        comm = 2.0 * (gpus - 1) * profile.allreduce.latency_s + 2.0 * (gpus - 1) / gpus * profile.num_params * profile.allreduce.seconds_per_param
    micro = _t_proc_scalar(profile, -(-batch // (gpus * accum_steps)))
    step = (accum_steps - 1) * micro + float(last_micro_step(micro, comm, profile.overlap))
    return 0.0 if not math.isfinite(step) else batch / step


def baseline_rate(spec: JobSpec) -> float:
    """Seed 000's T_j(b_max, 1): one GPU at the largest batch that fits it (and the job's max).

    Used only to normalise, so it is defined even for jobs whose min_batch cannot run on one GPU.
    """
    return throughput(spec.profile, min(spec.profile.max_batch_per_gpu, spec.max_batch), 1)


@dataclass(frozen=True, slots=True)
class RateTable:
    """Per GPU count k (index 0..kmax): the best global batch and its samples/s (-inf: infeasible).

    ``accum`` holds the gradient-accumulation steps per count (None: 1 everywhere).
    """

    batches: np.ndarray
    rates: np.ndarray
    accum: np.ndarray | None = None

    def feasible_counts(self) -> np.ndarray:
        return np.flatnonzero(np.isfinite(self.rates))

    def accum_steps(self, gpus: int) -> int:
        return 1 if self.accum is None else int(self.accum[gpus])


def _best_batches(profile: ThroughputProfile, lo: int, hi: int, kmax: int, accumulate: bool = False) -> RateTable:
    batches = np.zeros(kmax + 1, dtype=np.int64)
    rates = np.full(kmax + 1, -np.inf)
    accum = np.ones(kmax + 1, dtype=np.int64)
    cap = profile.max_batch_per_gpu
    for k in range(1, kmax + 1):
        upper = min(hi, k * cap)
        lower = max(lo, k)
        if lower > upper:
            if accumulate and lower <= hi:
                # Memory forces accumulation: the smallest batch in range, in as few micro-steps as fit.
                steps = -(-lower // (k * cap))
                if lower < k * steps:
                    continue  # some rank would get an empty micro-batch
                micro = t_proc(profile, -(-lower // (k * steps)))
                step = (steps - 1) * micro + last_micro_step(micro, t_comm(profile.allreduce, profile.num_params, k), profile.overlap)
                batches[k], rates[k], accum[k] = lower, lower / step, steps
            continue
        # Within one per-GPU size c the step time is fixed, so the largest global batch
        # with ceil(b/k) = c is best: min(c*k, upper). Candidates are one per c.
        c = np.arange(math.ceil(lower / k), math.ceil(upper / k) + 1)
        cand = np.minimum(c * k, upper)
        cand = cand[cand >= lower]
        step = last_micro_step(t_proc(profile, np.ceil(cand / k)), t_comm(profile.allreduce, profile.num_params, k), profile.overlap)
        r = cand / step
        i = int(np.argmax(r))  # first maximum: the smallest batch among equals
        batches[k], rates[k] = cand[i], r[i]
    batches.setflags(write=False)
    rates.setflags(write=False)
    accum.setflags(write=False)
    return RateTable(batches, rates, accum if accumulate else None)


@lru_cache(maxsize=8192)
def _cached_table(profile: ThroughputProfile, lo: int, hi: int, kmax: int, accumulate: bool) -> RateTable:
    return _best_batches(profile, lo, hi, kmax, accumulate)


def rate_table(spec: JobSpec, kmax: int, batch: int | None = None, accumulate: bool = False) -> RateTable:
    """Best batch and samples/s for k = 0..kmax GPUs, within the job's GPU limits.

    ``batch`` pins the global batch (fixed-batch baselines, non-elastic jobs); otherwise the
    batch is chosen in [min_batch, max_batch] — seed 000's b_opt(k). Counts outside
    [min_gpus, max_gpus] are infeasible. With ``accumulate``, a count whose smallest
    allowed batch exceeds k x the memory cap runs that batch as gradient-accumulation steps
    (costed in ``accum``) instead of being infeasible. Cached: profiles are immutable and
    tables are asked for at every re-allocation.
    """
    lo, hi = (batch, batch) if batch is not None else (spec.min_batch, spec.max_batch)
    table = _cached_table(spec.profile, lo, hi, kmax, accumulate)
    if spec.min_gpus == 1 and spec.max_gpus >= kmax:
        return table
    rates = table.rates.copy()
    rates[: spec.min_gpus] = -np.inf
    rates[spec.max_gpus + 1 :] = -np.inf
    rates.setflags(write=False)
    return RateTable(table.batches, rates, table.accum)


def b_opt(spec: JobSpec, gpus: int) -> int | None:
    """Seed 000's best global batch on ``gpus`` GPUs, or None if no batch in range fits."""
    table = rate_table(spec, gpus)
    return int(table.batches[gpus]) if math.isfinite(table.rates[gpus]) else None
