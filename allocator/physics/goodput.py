"""Goodput = throughput x statistical efficiency (Pollux, OSDI'21), with accumulation and hosts.

Statistical efficiency comes from the gradient noise scale B_noise (McCandlish et al. 2018,
"An Empirical Model of Large-Batch Training"): reaching a given loss takes
E_min (1 + B / B_noise) samples at batch B, so relative to the job's base batch B0 one
sample at batch B is worth

    E(B) = (B_noise + B0) / (B_noise + B)

base-batch-equivalent samples (E(B0) = 1; larger batches are worth less per sample). A job's
work is counted in those samples, so it does not depend on the batch it runs at.

Throughput with gradient accumulation: a global batch B on k GPUs runs s = ceil(B / (k cap))
micro-steps of c = ceil(B / (k s)) samples per rank, then one allreduce:

    T(B, k) = B / ((s - 1) t_proc(c) + t_proc(c) (+) t_comm(p, k, h)),     goodput(B, k) = T(B, k) E(B)

where h is the number of hosts a job packed onto as few hosts as possible spans; t_comm uses
the profile's inter-host allreduce fit when h > 1 and one is known (see ``allocator.physics.topology``);
(+) is ``allocator.physics.throughput.last_micro_step``: the allreduce overlaps the last micro-step's
backward pass as far as the profile's ``overlap`` says (a plain sum by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np

from allocator.physics.noise import NoiseTrajectory
from allocator.physics.throughput import last_micro_step, t_proc
from allocator.physics.topology import comm_time, hosts_spanned
from allocator.types import JobSpec, ThroughputProfile

__all__ = ["GoodputTable", "NoiseModel", "NoiseTrajectory", "SpecNoise", "WorkMeter", "base_batch", "efficiency", "goodput_table", "raw_sample_budget", "step_time"]


def base_batch(spec: JobSpec) -> int:
    """B0: the batch the job's work is defined at — its ``base_batch`` if given, else its fixed
    batch if it has one, else its smallest."""
    if spec.base_batch is not None:
        return spec.base_batch
    return spec.fixed_batch if spec.fixed_batch is not None else spec.min_batch


def efficiency(noise_scale: float, base: float, batch: float | np.ndarray) -> float | np.ndarray:
    """Base-batch-equivalent samples per sample at ``batch``: (B_noise + B0) / (B_noise + B)."""
    b = np.asarray(batch, dtype=float)
    out = np.ones_like(b) if math.isinf(noise_scale) else (noise_scale + base) / (noise_scale + b)
    return float(out) if out.ndim == 0 else out


def step_time(spec: JobSpec, batch: int, gpus: int, accum_steps: int = 1, gpus_per_host: int | None = None) -> float:
    """One optimizer step: ``accum_steps`` forward/backward passes plus one allreduce (inf if it does not fit)."""
    if gpus < 1 or accum_steps < 1 or batch < gpus * accum_steps:
        return math.inf
    micro = -(-batch // (gpus * accum_steps))
    hosts = hosts_spanned(gpus, gpus_per_host)
    compute = float(t_proc(spec.profile, micro))
    if not math.isfinite(compute):
        return math.inf  # beyond the memory cap (and 0 x inf would be nan below)
    return (accum_steps - 1) * compute + float(last_micro_step(compute, float(comm_time(spec.profile, gpus, hosts)), spec.profile.overlap))


@dataclass(frozen=True, slots=True)
class GoodputTable:
    """Per GPU count k (0..kmax): the goodput-maximising batch, its accumulation steps and goodput (-inf: infeasible)."""

    batches: np.ndarray
    accum: np.ndarray
    goodput: np.ndarray

    def feasible_counts(self) -> np.ndarray:
        return np.flatnonzero(np.isfinite(self.goodput))


# Above this many candidate configurations per table (absurd ranges: a memory cap of a few
# samples and a maximum batch of a million) the table is built on a geometric grid of batches.
MAX_CANDIDATES = 1 << 18


def _block_tops(lo: int, hi: int, kmax: int, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The candidate configurations (k, s, c, B), grouped by GPU count k, batch rising within each k.

    On k GPUs a global batch B runs s = ceil(B / (k cap)) micro-steps of c = ceil(B / (k s))
    samples per rank, and the step time depends on (k, s, c) only. Within one such block the
    goodput rises with B (throughput is proportional to B, and B / (B_noise + B) rises), so the
    block's best batch is its largest in range, min(k s c, hi): one candidate per block,
    about (hi - lo) ln(kmax) of them in all, instead of kmax x (hi - lo) batches.
    """
    ks = np.arange(1, kmax + 1, dtype=np.int64)
    s_lo = np.maximum(1, -(-lo // (ks * cap)))
    s_hi = -(-hi // (ks * cap))
    n_s = s_hi - s_lo + 1
    k_of, s_of = np.repeat(ks, n_s), _ranges(s_lo, n_s)
    ks_of = k_of * s_of
    # c such that B = k s c lies above the (s - 1)-step range and at or above lo, up to the cap.
    c_lo = -(-np.maximum(lo, k_of * cap * (s_of - 1) + 1) // ks_of)
    c_hi = np.minimum(cap, -(-hi // ks_of))
    n_c = np.maximum(c_hi - c_lo + 1, 0)
    if int(n_c.sum()) > MAX_CANDIDATES:
        return _grid(lo, hi, kmax, cap)
    k, s, c = np.repeat(k_of, n_c), np.repeat(s_of, n_c), _ranges(c_lo, n_c)
    return k, s, c, np.minimum(k * s * c, hi)


def _ranges(first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """first[0], first[0] + 1, ... (counts[0] values), then first[1], ... — as one flat array."""
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(first, counts) + offsets


def _grid(lo: int, hi: int, kmax: int, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A geometric grid of 2048 batches in [lo, hi] for every k (goodput is smooth in B that far out)."""
    batches = np.unique(np.round(np.geomspace(lo, hi, 2048)).astype(np.int64))
    k = np.repeat(np.arange(1, kmax + 1, dtype=np.int64), batches.size)
    b = np.tile(batches, kmax)
    s = -(-b // (k * cap))
    return k, s, -(-b // (k * s)), b


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a job's candidate configurations depend on: everything but the noise scale."""

    profile: ThroughputProfile
    lo: int
    hi: int
    kmax: int
    gpus_per_host: int | None


@dataclass(frozen=True, slots=True)
class _Candidates:
    """Per GPU count (grouped, ``counts`` each, batch rising): batch, accumulation steps, samples/s."""

    batch: np.ndarray
    accum: np.ndarray
    rate: np.ndarray
    counts: np.ndarray
    starts: np.ndarray


@lru_cache(maxsize=1024)
def _candidates(shape: _Shape) -> _Candidates:
    """``_block_tops`` with their throughput, pruned to those a goodput maximum can pick.

    E(B) never rises with B, so a candidate whose throughput is not above that of a smaller
    batch on the same GPU count has no more goodput than it at any noise scale: dropping it
    keeps every maximum and every tie's smallest batch. The first candidate of each count stays.
    """
    k, s, c, b = _block_tops(shape.lo, shape.hi, shape.kmax, shape.profile.max_batch_per_gpu)
    ks = np.arange(1, shape.kmax + 1, dtype=np.int64)
    hosts = np.ones(shape.kmax, dtype=np.int64) if shape.gpus_per_host is None else -(-ks // shape.gpus_per_host)
    comm = np.asarray(comm_time(shape.profile, ks, hosts), dtype=float)
    compute = np.asarray(t_proc(shape.profile, c.astype(float)), dtype=float)
    t = (s - 1) * compute + np.asarray(last_micro_step(compute, comm[k - 1], shape.profile.overlap), dtype=float)
    rate = np.where(b >= k * s, b / t, 0.0)  # a rank with an empty micro-batch: infeasible
    # Running maximum of the rate within each count, exactly: on the rates' ranks, with count
    # k's ranks lifted above count k-1's so one accumulate serves every count.
    rank = np.unique(rate, return_inverse=True)[1].reshape(-1).astype(np.int64)
    lift = (k - 1) * (int(rank.max()) + 1)
    running = np.maximum.accumulate(rank + lift) - lift
    counts = np.bincount(k, minlength=shape.kmax + 1)[1:]
    starts = np.cumsum(counts) - counts
    keep = np.ones(rate.size, dtype=bool)
    keep[1:] = rank[1:] > running[:-1]
    keep[starts] = True
    counts = np.bincount(k[keep], minlength=shape.kmax + 1)[1:]
    return _Candidates(b[keep], s[keep], rate[keep], counts, np.cumsum(counts) - counts)


@lru_cache(maxsize=4096)
def _best_per_count(shape: _Shape, noise_scale: float, base: int) -> GoodputTable:
    cand = _candidates(shape)
    good = cand.rate * np.asarray(efficiency(noise_scale, base, cand.batch), dtype=float)
    best = np.maximum.reduceat(good, cand.starts)
    hits = np.flatnonzero(good == np.repeat(best, cand.counts))
    first = hits[np.searchsorted(hits, cand.starts)]  # the first maximum of each k: the smallest batch among equals
    batches = np.concatenate([[0], cand.batch[first]])
    accum = np.concatenate([[1], cand.accum[first]])
    goodput = np.concatenate([[-np.inf], np.where(best > 0, best, -np.inf)])
    for array in (batches, accum, goodput):
        array.setflags(write=False)
    return GoodputTable(batches, accum, goodput)


def goodput_rows(spec: JobSpec, kmax: int, noise_scale: float, gpus_per_host: int | None = None, batch: int | None = None) -> GoodputTable:
    """The best batch, accumulation and goodput for k = 0..kmax GPUs, ignoring the job's GPU limits.

    Read-only and cached: profiles are immutable and the same (job, noise scale) is asked for
    at every decision. ``batch`` pins the global batch (a non-elastic job's is always pinned).
    """
    lo, hi = (batch, batch) if batch is not None else (spec.min_batch, spec.max_batch)
    if not spec.elastic and batch is None:
        lo = hi = spec.batch_when_fixed
    return _best_per_count(_Shape(spec.profile, lo, hi, kmax, gpus_per_host), float(noise_scale), base_batch(spec))


def allowed_counts(spec: JobSpec, kmax: int) -> np.ndarray:
    """GPU counts 0..kmax the job may run on: [min_gpus, max_gpus], or a non-elastic job's requested count."""
    allowed = np.zeros(kmax + 1, dtype=bool)
    if spec.elastic:
        allowed[spec.min_gpus : spec.max_gpus + 1] = True
    elif spec.requested_gpus <= kmax:
        allowed[spec.requested_gpus] = True
    return allowed


def goodput_table(
    spec: JobSpec,
    kmax: int,
    noise_scale: float,
    batch: int | None = None,
    gpus_per_host: int | None = None,
    limit_gpus: bool = True,
) -> GoodputTable:
    """Best batch (with the fewest accumulation steps that fit) per GPU count, by goodput.

    ``batch`` pins the global batch; otherwise every batch in [min_batch, max_batch] is a
    candidate (``_block_tops``: exactly, by one candidate per step-time block). With
    ``limit_gpus`` counts outside the job's [min_gpus, max_gpus] (and, for a non-elastic job,
    any count but its requested one) are infeasible. Ties go to the smaller batch.
    """
    rows = goodput_rows(spec, kmax, noise_scale, gpus_per_host, batch)
    if not limit_gpus:
        return rows
    return GoodputTable(rows.batches, rows.accum, np.where(allowed_counts(spec, kmax), rows.goodput, -np.inf))


@runtime_checkable
class NoiseModel(Protocol):
    """Whatever decides which B_noise a job has (a goodput policy): its measured value if any, else a model."""

    def noise_scale(self, job: JobSpec, samples_done: float, reported: float | None = None) -> float: ...


@dataclass(frozen=True, slots=True)
class SpecNoise:
    """The B_noise a job has when no goodput policy models it: its measured value, else its own
    ``noise_scale`` trajectory at its progress, else none (inf: every sample counts the same)."""

    def noise_scale(self, job: JobSpec, samples_done: float, reported: float | None = None) -> float:
        if reported is not None:
            return reported
        if job.noise_scale is None:
            return math.inf
        return job.noise_scale.at(samples_done / job.total_samples)


def raw_sample_budget(spec: JobSpec) -> int:
    """The most samples a job whose ``total_samples`` are base-batch-equivalent can need.

    E(B) = (B_noise + B0) / (B_noise + B) >= min(1, B0 / B) for every B_noise > 0, so at batches
    up to B_max the job is done by total x max(B_max, B0) / B0 samples, whatever its noise scale does.
    """
    b0 = base_batch(spec)
    top = max(spec.max_batch, spec.batch_when_fixed, b0)
    return -(-spec.total_samples * top // b0)


@dataclass(slots=True)
class WorkMeter:
    """A real job's progress in base-batch-equivalent samples, from the reports of a running trainer.

    Each ``observe`` gives the trainer's counters (steps, samples), the global batch it runs now
    and the B_noise to value them at; the samples since the last report count E(B) each. A
    report that follows a rescale has steps at two batches: with the steps and samples both
    known, the split between the old and the new batch is exact (one rescale between two
    reports). The noise scale is the one at report time (it moves slowly; its smoothed
    estimate is what the trainer has). Counters that go back (a job resumed from an older
    checkpoint) take back the lost samples at today's value.
    """

    spec: JobSpec
    step: int = 0
    samples: int = 0
    batch: int | None = None
    done: float = 0.0

    def observe(self, step: int, samples: int, batch: int, noise_scale: float) -> float:
        b0 = base_batch(self.spec)
        worth_now = float(efficiency(noise_scale, b0, batch))
        d_steps, d_samples = step - self.step, samples - self.samples
        if d_samples < 0 or d_steps < 0:
            self.done = max(0.0, self.done + d_samples * worth_now)
        elif d_samples > 0:
            old = self.batch if self.batch is not None else batch
            # n_old steps at the old batch, the rest at the new: n_old old + (d_steps - n_old) new = d_samples.
            n_old = d_steps if old == batch else min(max((d_samples - d_steps * batch) / (old - batch), 0.0), d_steps)
            at_old = min(n_old * old, d_samples)
            self.done += at_old * float(efficiency(noise_scale, b0, old)) + (d_samples - at_old) * worth_now
        self.step, self.samples, self.batch = step, samples, batch
        return self.done
