"""Trust measurements over predictions: what a job measured per configuration outranks the model.

A policy decides on a throughput model (``allocator.physics.throughput``, refitted online by
``allocator.profiles.refit``). A model is a line through a few points; a real job can run a
configuration it predicts faster at a rate well below one it ran before (measured: a job that
ran 2 GPUs x batch 256 at 750 samples/s was grown back to 2 x 36, predicted better, measured
500). So each running job carries a ``MeasuredTable`` — per (GPUs, global batch, accumulation
steps) the samples/s its steps really took — and ``trust_measurements`` adapts the policy's
answer with it, as AdaptDL's adapter applies a pure policy: the policy stays as it is, the
table is data in the snapshot, and only a job's batch (never its GPU count) is changed, so
the allocation's capacity and GPU counts are the policy's.

Per running job with share s on k GPUs, and ``best`` the configuration with the highest value
the job measured on k GPUs (value: samples/s, times the statistical efficiency E(B) when the
policy weighs batches by goodput):

* s measured: kept unless its value is below ``(1 - tolerance)`` of best's; then best replaces
  it. That is the revert: a configuration that measured worse is reverted at the next decision,
  and since the table keeps its figure it is "remembered" — never chosen again while best is
  there (no extra state: the table is the memory).
* s unmeasured, with something measured on k GPUs: an *exploration*. Allowed only while the
  model predicts it better than best's measured value by more than ``tolerance`` and the job
  has measured at most ``max_explorations`` other configurations on k GPUs; otherwise best.
* nothing measured on k GPUs yet: s as is (there is nothing to trust instead).

The cost an exploration can have is bounded: at most ``max_explorations`` per job and GPU
count, and each lasts until the job has measured it and the next decision reverts it (the
loop decides again at its next tick when a running job's share would be reverted), so a job
loses at most ``max_explorations x (GPU counts it runs at) x`` one decision interval at the
worse rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from allocator.checks import require
from allocator.physics.goodput import NoiseModel, base_batch, efficiency
from allocator.profiles.measured_types import MeasuredRate, MeasuredTable
from allocator.physics.throughput import throughput
from allocator.types import Allocation, ClusterSnapshot, JobSpec, RunningJob, Share


@dataclass(frozen=True, slots=True)
class TrustSettings:
    """``tolerance``: values within this fraction count as equal (a measured rate wobbles by a few
    per cent between generations here); ``max_explorations``: unmeasured configurations a job
    may try per GPU count once one is measured there."""

    tolerance: float = 0.05
    max_explorations: int = 2

    def __post_init__(self) -> None:
        t = self.tolerance
        require(isinstance(t, (int, float)) and 0 <= t < 1, "TrustSettings", "tolerance", t, "must lie in [0, 1)")
        m = self.max_explorations
        require(isinstance(m, int) and not isinstance(m, bool) and m >= 0, "TrustSettings", "max_explorations", m, "must be an integer >= 0")


# A job's value of a global batch at some samples/s: the rate itself, or the goodput
# (rate x statistical efficiency) for a policy that weighs batches by it.
Value = Callable[[RunningJob, int, float], float]


def rate_value(job: RunningJob, batch: int, samples_per_s: float) -> float:
    return samples_per_s


def predicted_rate(spec: JobSpec, share: Share) -> float:
    """The model's samples/s for ``share`` (the spec's profile: the job's refit when it has one)."""
    return throughput(spec.profile, share.global_batch, share.gpus, share.accum_steps)


def _best(job: RunningJob, table: MeasuredTable, gpus: int, value: Value) -> MeasuredRate | None:
    spec = job.spec
    fits = [r for r in table.at(gpus) if spec.min_batch <= r.batch <= spec.max_batch]
    return max(fits, key=lambda r: (value(job, r.batch, r.samples_per_s), r.batch), default=None)


def trusted_share(job: RunningJob, share: Share, settings: TrustSettings = TrustSettings(), value: Value = rate_value) -> Share:
    """``share`` for ``job`` as its measurements allow (see the module's rules)."""
    table = job.measured
    if table is None:
        return share
    best = _best(job, table, share.gpus, value)
    if best is None:
        return share
    best_value = value(job, best.batch, best.samples_per_s)
    to_best = replace(share, global_batch=best.batch, accum_steps=best.accum_steps)
    seen = table.rate(share.gpus, share.global_batch, share.accum_steps)
    if seen is not None:
        return share if value(job, seen.batch, seen.samples_per_s) >= (1 - settings.tolerance) * best_value else to_best
    explored = len(table.at(share.gpus)) - 1  # the first configuration on k GPUs was no exploration
    if explored >= settings.max_explorations:
        return to_best
    promised = value(job, share.global_batch, predicted_rate(job.spec, share))
    return share if promised > (1 + settings.tolerance) * best_value else to_best


def goodput_value(noise: NoiseModel) -> Value:
    """Goodput as a noise-aware policy weighs a batch: samples/s x E(B) at the job's noise scale."""

    def value(job: RunningJob, batch: int, samples_per_s: float) -> float:
        scale = noise.noise_scale(job.spec, job.samples_done, job.noise_scale)
        return samples_per_s * float(efficiency(scale, base_batch(job.spec), batch))

    return value


def would_revert(snapshot: ClusterSnapshot, allocation: Allocation, settings: TrustSettings = TrustSettings(), value: Value = rate_value) -> bool:
    """Does a running job run a share its measurements no longer allow (the loop then decides again)?"""
    return trust_measurements(snapshot, allocation, settings, value) != allocation


def trust_measurements(snapshot: ClusterSnapshot, allocation: Allocation, settings: TrustSettings = TrustSettings(), value: Value = rate_value) -> Allocation:
    """``allocation`` with each running job's share adapted to what it measured; jobs without a
    table (queued ones, executors that measure nothing) keep the policy's share."""
    running = {r.spec.id: r for r in snapshot.running if r.measured is not None}
    if not running:
        return allocation
    return Allocation(tuple((jid, trusted_share(running[jid], s, settings, value) if jid in running else s) for jid, s in allocation.shares))
