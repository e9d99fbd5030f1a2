"""What a size-aware policy believes a job has left to do, from its declared work and its progress.

A declared ``total_samples`` is read three ways (``JobSpec.size``, or the policy's ``sizes``):

* exact: what is left is the declared total minus what is done;
* an estimate: the true total S is unknown but near the declaration D — a log-uniform prior on
  [D / spread, D · spread] — and the job's progress d rules out S <= d, so what is left is
  E[S − d | S > d] = (b − m) / ln(b / m) − d with m = max(d, D / spread), b = D · spread. Past b
  every guess the prior allowed has failed, and the job counts as unknown;
* unknown: no declaration is read. A job expected to run as long again as it has already run
  (the Lindy rule of a heavy-tailed size distribution, behind least-attained-service scheduling):
  what is left is its progress d, and at least ``floor`` samples (what the job does in
  ``UNKNOWN_FLOOR_S`` seconds on one GPU: a job that has just started is not taken for done).

Why a prior and not the declaration as is: a job that overruns an estimate would otherwise look
nearly done for ever (its weight growing without bound as D − d falls to 0 and stays there),
and one that will stop early looks longer than it is only by its error, which the conditional
expectation also shrinks as progress passes D / spread.
"""

from __future__ import annotations

import math
from enum import Enum

import numpy as np

from allocator.types import ClusterSnapshot, JobSpec, SizeKnowledge

# A declared size, read as an estimate, is taken to be off by up to this factor either way.
ESTIMATE_SPREAD = 2.0
# A job of unknown size counts as having at least this many one-GPU seconds left.
UNKNOWN_FLOOR_S = 600.0


class SizeUse(str, Enum):
    """How a policy reads the jobs' declared sizes (its ``sizes`` parameter)."""

    DECLARED = "declared"  # as each job's ``size`` says: exact, an estimate, or unknown
    ESTIMATE = "estimate"  # every declared size as an estimate
    IGNORE = "ignore"  # size-oblivious: no declared size is read; every job by its attained service


def knowledge(job: JobSpec, use: SizeUse) -> SizeKnowledge:
    if use is SizeUse.IGNORE:
        return SizeKnowledge.UNKNOWN
    if use is SizeUse.ESTIMATE and job.size is SizeKnowledge.EXACT:
        return SizeKnowledge.ESTIMATE
    return job.size


def expected_remaining(declared: float, done: float, known: SizeKnowledge, spread: float = ESTIMATE_SPREAD, floor: float = 1.0) -> float:
    """Samples a job is expected still to process (see the module docstring)."""
    if known is SizeKnowledge.EXACT:
        return max(declared - done, 0.0)
    if known is SizeKnowledge.ESTIMATE:
        top = declared * spread
        if done < top:
            low = max(done, declared / spread)
            return max((top - low) / math.log(top / low) - done, 0.0) if top > low else 0.0
    return max(done, floor)


def expected_total(job: JobSpec, use: SizeUse, one_gpu: float, spread: float = ESTIMATE_SPREAD) -> float:
    """What a queued job is expected to process in all (its expected remaining work at no progress);
    ``one_gpu`` its goodput on one GPU (samples/s), which sets an unknown job's floor."""
    return expected_remaining(float(job.total_samples), 0.0, knowledge(job, use), spread, _floor(one_gpu))


def remaining_samples(snapshot: ClusterSnapshot, use: SizeUse, one_gpu: np.ndarray, spread: float = ESTIMATE_SPREAD) -> np.ndarray:
    """Per job (running, then queued): its expected remaining samples."""
    specs = [(r.spec, r.samples_done) for r in snapshot.running] + [(j, 0.0) for j in snapshot.queued]
    return np.array(
        [expected_remaining(float(s.total_samples), done, knowledge(s, use), spread, _floor(g)) for (s, done), g in zip(specs, one_gpu)], dtype=float
    )


def _floor(one_gpu: float) -> float:
    return UNKNOWN_FLOOR_S * one_gpu if math.isfinite(one_gpu) and one_gpu > 0 else 1.0


def remaining_weights(remaining: np.ndarray, one_gpu: np.ndarray, exponent: float) -> np.ndarray:
    """Per job: (R_j / geometric mean of R)^-exponent, R_j its expected remaining samples over its
    one-GPU goodput — the seconds it would still run alone on one GPU.

    Why: the mean JCT counts how many jobs are unfinished; a GPU that brings a short job to its end
    sooner removes a job from that count sooner (the remaining-size ordering behind SRPT and, for
    concave speedups, heSRPT), while a long job's gain is paid back only at its distant end. The power
    keeps the tilt gentle: speedups are concave, so sharing stays right (exponent 0: no tilt).
    A job whose run cannot be told (no goodput on one GPU) weighs 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        run = np.maximum(remaining, 1.0) / one_gpu
    known = np.isfinite(run) & (run > 0)
    if not known.any():
        return np.ones(len(remaining))
    scale = np.exp(np.mean(np.log(run[known])))
    return np.where(known, run / scale, 1.0) ** -exponent
