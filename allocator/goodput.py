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

    T(B, k) = B / (s t_proc(c) + t_comm(p, k, h)),     goodput(B, k) = T(B, k) E(B)

where h is the number of hosts a job packed onto as few hosts as possible spans; t_comm uses
the profile's inter-host allreduce fit when h > 1 and one is known (see ``allocator.topology``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from allocator.throughput import t_proc
from allocator.topology import comm_time, hosts_spanned
from allocator.types import JobSpec


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and not math.isnan(value)):
        raise ValueError(f"{name}={value!r}: must be a number > 0 (inf allowed: no gradient noise limit)")


@dataclass(frozen=True, slots=True)
class NoiseTrajectory:
    """A job's gradient noise scale over its progress, piecewise constant.

    ``bounds`` are progress fractions 0 = f0 < f1 < ... < fn = 1; ``values[i]`` is B_noise on
    [f_i, f_{i+1}). B_noise typically grows as training proceeds (McCandlish et al., Fig. 6),
    which is why a goodput policy raises batches late in a job.
    """

    bounds: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "bounds", tuple(float(b) for b in self.bounds))
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        b, v = self.bounds, self.values
        if len(b) < 2 or b[0] != 0.0 or b[-1] != 1.0 or any(y <= x for x, y in zip(b, b[1:])):
            raise ValueError(f"NoiseTrajectory.bounds={b!r}: must rise strictly from 0 to 1")
        if len(v) != len(b) - 1:
            raise ValueError(f"NoiseTrajectory.values={v!r}: need {len(b) - 1} values for {len(b)} bounds")
        for x in v:
            _check_positive("NoiseTrajectory.values", x)

    @classmethod
    def constant(cls, noise_scale: float) -> NoiseTrajectory:
        return cls((0.0, 1.0), (noise_scale,))

    @classmethod
    def from_points(cls, fractions: Sequence[float], noise_scales: Sequence[float]) -> NoiseTrajectory:
        """Measured (progress fraction, B_noise) points -> segments split halfway between points."""
        if len(fractions) == 0 or len(fractions) != len(noise_scales):
            raise ValueError(f"fractions={list(fractions)!r}: need one per noise scale, at least one")
        order = np.argsort(np.asarray(fractions, dtype=float), kind="stable")
        f = [float(fractions[i]) for i in order]
        v = [float(noise_scales[i]) for i in order]
        mids = [(a + b) / 2 for a, b in zip(f, f[1:])]
        return cls((0.0, *mids, 1.0), tuple(v))

    def at(self, fraction: float) -> float:
        i = bisect.bisect_right(self.bounds, min(max(fraction, 0.0), 1.0)) - 1
        return self.values[min(i, len(self.values) - 1)]


def base_batch(spec: JobSpec) -> int:
    """B0: the batch the job's work is defined at — its fixed batch if it has one, else its smallest."""
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
    return accum_steps * float(t_proc(spec.profile, micro)) + float(comm_time(spec.profile, gpus, hosts))


@dataclass(frozen=True, slots=True)
class GoodputTable:
    """Per GPU count k (0..kmax): the goodput-maximising batch, its accumulation steps and goodput (-inf: infeasible)."""

    batches: np.ndarray
    accum: np.ndarray
    goodput: np.ndarray

    def feasible_counts(self) -> np.ndarray:
        return np.flatnonzero(np.isfinite(self.goodput))


MAX_CANDIDATES = 4096


def _candidates(lo: int, hi: int) -> np.ndarray:
    """Every batch in [lo, hi]; for very wide ranges, the first MAX_CANDIDATES/2 and a geometric
    grid above them (goodput is smooth in B there, and the table stays kmax x 4096)."""
    if hi - lo + 1 <= MAX_CANDIDATES:
        return np.arange(lo, hi + 1, dtype=np.int64)
    half = MAX_CANDIDATES // 2
    grid = np.round(np.geomspace(lo + half, hi, half)).astype(np.int64)
    return np.unique(np.concatenate([np.arange(lo, lo + half, dtype=np.int64), grid, [hi]]))


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
    candidate (a grid for ranges wider than MAX_CANDIDATES). With ``limit_gpus`` counts outside the job's [min_gpus, max_gpus] (and, for a
    non-elastic job, any count but its requested one) are infeasible. Ties go to the
    smaller batch.
    """
    lo, hi = (batch, batch) if batch is not None else (spec.min_batch, spec.max_batch)
    if not spec.elastic and batch is None:
        lo = hi = spec.batch_when_fixed
    cap = spec.profile.max_batch_per_gpu
    cand = _candidates(lo, hi)
    ks = np.arange(1, kmax + 1, dtype=np.int64)[:, None]
    steps = -(-cand[None, :] // (ks * cap))
    micro = -(-cand[None, :] // (ks * steps))
    hosts = np.array([hosts_spanned(int(k), gpus_per_host) for k in ks[:, 0]])
    comm = np.asarray(comm_time(spec.profile, ks[:, 0], hosts), dtype=float)[:, None]
    t = steps * np.asarray(t_proc(spec.profile, micro.astype(float)), dtype=float) + comm
    rate = np.where(cand[None, :] >= ks * steps, cand[None, :] / t, 0.0)
    good = rate * np.asarray(efficiency(noise_scale, base_batch(spec), cand), dtype=float)[None, :]
    best = np.argmax(good, axis=1)
    rows = np.arange(kmax)
    values = good[rows, best]
    batches = np.zeros(kmax + 1, dtype=np.int64)
    accum = np.ones(kmax + 1, dtype=np.int64)
    out = np.full(kmax + 1, -np.inf)
    batches[1:], accum[1:] = cand[best], steps[rows, best]
    out[1:] = np.where(values > 0, values, -np.inf)
    if limit_gpus:
        allowed = np.zeros(kmax + 1, dtype=bool)
        if spec.elastic:
            allowed[spec.min_gpus : spec.max_gpus + 1] = True
        elif spec.requested_gpus <= kmax:
            allowed[spec.requested_gpus] = True
        out[~allowed] = -np.inf
    return GoodputTable(batches, accum, out)


@runtime_checkable
class NoiseModel(Protocol):
    """Whatever decides which B_noise a job has (a goodput policy): its measured value if any, else a model."""

    def noise_scale(self, job: JobSpec, samples_done: float, reported: float | None = None) -> float: ...


def raw_sample_budget(spec: JobSpec) -> int:
    """The most samples a job whose ``total_samples`` are base-batch-equivalent can need.

    E(B) = (B_noise + B0) / (B_noise + B) >= B0 / B for every B_noise > 0, so at batches up to
    B_max the job is done by total x B_max / B0 samples, whatever its noise scale does.
    """
    top = max(spec.max_batch, spec.batch_when_fixed)
    return -(-spec.total_samples * top // base_batch(spec))


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
