"""Goodput-aware elastic policy: seed 000's DP over jobs x GPUs with goodput as the value.

For each job and GPU count k the batch (and the gradient-accumulation steps it needs) is
the one that maximises goodput(B, k) = T(B, k) E(B) at the job's current gradient noise
scale (``allocator.physics.goodput``). A job's speedup on k GPUs is its best goodput there over its
best goodput on one GPU; the DP maximises the power mean of the speedups,
(1/J sum_j s_j^p)^(1/p), as Pollux does (OSDI'21, eq. 8): p = 1 is total normalised
goodput, p -> 0 the geometric mean, p < 0 favours the jobs that gain least (small jobs do not
starve). For a fixed J that is the separable sum of s^p (p > 0), log s (p = 0) or -s^p
(p < 0), which the DP maximises exactly.

Two departures from Pollux's objective, both for the mean JCT (evidence: docs/policies.md):
each job's term is weighted by its expected remaining run to the power -``remaining_exponent``
(``allocator.policies.remaining``), and queued jobs start shortest predicted run first, with a
starvation guard (``GoodputDPQueued``); ``remaining_exponent=0, queue="fifo"`` is Pollux's
objective with the loop's FIFO admission. What is "remaining" follows ``sizes``: the declared
work as each job's ``size`` says (exact, an estimate read as a prior, unknown), or none at all
(``ignore``: size-oblivious, by attained service). p = 0.5 (between total goodput and its
geometric mean) keeps the mean of p = 1 with a lower p95 and makespan, and a change's pause is
weighed over the ``change_horizon_s`` a new share is expected to hold, not the job's whole run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from allocator.admission import admit_in_order
from allocator.physics.goodput import NoiseTrajectory, goodput_rows
from allocator.policies.base import register
from allocator.policies.dp import solve_dp
from allocator.policies.remaining import UNKNOWN_FLOOR_S, SizeUse, expected_total, knowledge, remaining_samples, remaining_weights
from allocator.physics.topology import gpus_per_host
from allocator.protocols import AdmissionDecision, OverflowMode
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, RunningJob, Share, SizeKnowledge


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


# Each job's term weighted by (its remaining run / the jobs' geometric mean)^-e: e = 0.25 lowered
# the mean JCT on Pollux's workloads and on seed 000's trace (docs/policies.md); 0 is Pollux's unweighted mean.
REMAINING_EXPONENT = 0.25
# The pause a change costs when neither the policy nor the run says: RescaleCost's in-place default.
DEFAULT_CHANGE_COST_S = 1.0
# How long a new share is expected to hold before the next change, when a change's pause is weighed:
# on Pollux's workloads (60 s ticks, 30 s changes) shares turn over every few minutes, and 300 s
# halved the rescales (docs/policies.md, issue 38); inf weighs the pause over the job's whole remaining run.
CHANGE_HORIZON_S = 300.0
# The power-mean exponent: between total goodput (1) and its geometric mean (0); 0.5 kept the mean
# JCT of p = 1 and lowered the p95 and makespan on Pollux's workloads (docs/policies.md, issue 38).
POWER = 0.5


@dataclass(frozen=True, slots=True)
class GoodputDP:
    """``noise`` maps a job id or a workload name to its B_noise trajectory, over the job's own
    ``noise_scale``; jobs with neither get ``default_noise_scale`` (inf: perfectly scalable,
    which reduces goodput to throughput). ``hosts`` is the GPUs per host when the snapshot
    carries no nodes (None: one flat network). ``remaining_exponent`` tilts GPUs towards jobs
    with less work left (``remaining_weights``; 0: none)."""

    noise: Mapping[str, NoiseTrajectory] = field(default_factory=dict)
    default_noise_scale: float = math.inf
    p: float = POWER
    hosts: int | None = None
    rescale_cost_s: float | None = None  # None: the run's own cost, as the executor charges it (RunningJob.change_cost_s), else 1 s
    remaining_exponent: float = REMAINING_EXPONENT
    sizes: SizeUse = SizeUse.DECLARED
    change_horizon_s: float = CHANGE_HORIZON_S
    name: str = "goodput_dp"

    def __post_init__(self) -> None:
        if not (isinstance(self.p, (int, float)) and math.isfinite(self.p)):
            raise ValueError(f"goodput_dp.p={self.p!r}: must be a finite number")
        if not (self.default_noise_scale > 0):
            raise ValueError(f"goodput_dp.default_noise_scale={self.default_noise_scale!r}: must be > 0")
        if self.hosts is not None and not (isinstance(self.hosts, int) and self.hosts >= 1):
            raise ValueError(f"goodput_dp.hosts={self.hosts!r}: must be a positive integer")
        if not (isinstance(self.remaining_exponent, (int, float)) and math.isfinite(self.remaining_exponent) and self.remaining_exponent >= 0):
            raise ValueError(f"goodput_dp.remaining_exponent={self.remaining_exponent!r}: must be a finite number >= 0")
        if self.rescale_cost_s is not None and not (isinstance(self.rescale_cost_s, (int, float)) and math.isfinite(self.rescale_cost_s) and self.rescale_cost_s >= 0):
            raise ValueError(f"goodput_dp.rescale_cost_s={self.rescale_cost_s!r}: must be a finite number of seconds >= 0")
        if not (isinstance(self.change_horizon_s, (int, float)) and self.change_horizon_s > 0):
            raise ValueError(f"goodput_dp.change_horizon_s={self.change_horizon_s!r}: must be a number of seconds > 0 (inf: the job's remaining run)")
        try:
            object.__setattr__(self, "sizes", SizeUse(self.sizes))
        except ValueError:
            raise ValueError(f"goodput_dp.sizes={self.sizes!r}: choose one of {', '.join(u.value for u in SizeUse)}") from None
        for key, trajectory in self.noise.items():
            if not isinstance(trajectory, NoiseTrajectory):
                raise ValueError(f"goodput_dp.noise[{key!r}]={trajectory!r}: must be a NoiseTrajectory")

    def noise_scale(self, job: JobSpec, samples_done: float, reported: float | None = None) -> float:
        """The job's own reported B_noise if the snapshot has one, else its trajectory (the
        policy's ``noise``, else the job's ``noise_scale``) at its progress over its declared work
        (the one use of a declared size when ``sizes`` is ``ignore``: a job that reports its noise
        scale, as real trainers and the simulator do, never needs it), else the default."""
        if reported is not None:
            return reported
        trajectory = self.noise.get(job.id) or self.noise.get(job.workload) or job.noise_scale
        if trajectory is None:
            return self.default_noise_scale
        return trajectory.at(samples_done / job.total_samples)

    def check_physics(self, jobs: Sequence[JobSpec], gpus_per_host: int | None = None) -> None:
        """Refuse a model that contradicts the run's physics: a ``noise`` entry unlike the job's
        ``noise_scale``, a finite ``default_noise_scale`` for a job without one (its samples all
        count the same), or ``hosts`` other than the physics' when a profile prices crossing hosts."""
        if self.hosts != gpus_per_host and any(j.profile.inter_host is not None for j in jobs):
            physics = "one flat network (no allreduce across hosts)" if gpus_per_host is None else f"hosts of {gpus_per_host} GPUs"
            raise ValueError(f"goodput_dp.hosts={self.hosts!r}: the run's physics places jobs on {physics}; set hosts to match")
        for job in jobs:
            key = job.id if job.id in self.noise else job.workload if job.workload in self.noise else None
            if key is not None and self.noise[key] != (job.noise_scale or NoiseTrajectory.constant(math.inf)):
                raise ValueError(
                    f"goodput_dp.noise[{key!r}]={_show(self.noise[key])}: job {job.id!r} has noise_scale={_show(job.noise_scale)}, "
                    "which is what the run's physics charges; give the noise scale on the job (docs/jobs-file.md) instead"
                )
            if key is None and job.noise_scale is None and math.isfinite(self.default_noise_scale):
                raise ValueError(
                    f"goodput_dp.default_noise_scale={self.default_noise_scale:g}: job {job.id!r} carries no noise_scale, so the "
                    "run's physics counts its samples the same at every batch; give the jobs a noise_scale (docs/jobs-file.md) instead"
                )

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        jobs = snapshot.jobs
        if not jobs:
            return Allocation()
        values, rows = self._values(snapshot)
        counts, _ = solve_dp(values, snapshot.capacity)
        return Allocation(
            tuple((j.id, Share(gpus=int(k), global_batch=int(r.batches[k]), accum_steps=int(r.accum[k]))) for j, r, k in zip(jobs, rows, counts))
        )

    def _values(self, snapshot: ClusterSnapshot) -> tuple[np.ndarray, list]:
        """The DP's table: per job (running, then queued) and GPU count, its term of the objective."""
        jobs = snapshot.jobs
        kmax = min(snapshot.capacity, max(j.max_gpus for j in jobs))
        if kmax < 1:
            raise InfeasibleError(f"capacity={snapshot.capacity}: no GPU to give")
        per_host = gpus_per_host(snapshot) or self.hosts
        done = {r.spec.id: r.samples_done for r in snapshot.running}
        reported = {r.spec.id: r.noise_scale for r in snapshot.running}
        # One row per job: its unlimited goodput table up to the GPUs it may use (cached), then
        # every speedup, limit and fairness term for all jobs at once.
        goodput = np.full((len(jobs), kmax + 1), -np.inf)
        rows = []
        for i, job in enumerate(jobs):
            top = min(kmax, job.max_gpus if job.elastic else job.requested_gpus)
            row = goodput_rows(job, top, self.noise_scale(job, done.get(job.id, 0.0), reported.get(job.id)), per_host)
            goodput[i, : top + 1] = row.goodput
            rows.append(row)
        # The counts each job may run on: [min_gpus, max_gpus], or a non-elastic job's requested count.
        low = np.array([j.min_gpus if j.elastic else j.requested_gpus for j in jobs])[:, None]
        high = np.array([j.max_gpus if j.elastic else j.requested_gpus for j in jobs])[:, None]
        ks = np.arange(kmax + 1)[None, :]
        one = goodput[:, 1:2].copy()
        goodput = self._after_rescale(snapshot, goodput)
        values = fairness_value(np.where((ks >= low) & (ks <= high), goodput, -np.inf) / one, self.p)
        if self.remaining_exponent != 0:
            values = values * remaining_weights(self.remaining(snapshot, one[:, 0]), one[:, 0], self.remaining_exponent)[:, None]
        return values, rows

    def remaining(self, snapshot: ClusterSnapshot, one_gpu: np.ndarray) -> np.ndarray:
        """Per job (running, then queued): the samples it is expected still to process, as ``sizes``
        reads the declared ones (``allocator.policies.remaining``)."""
        return remaining_samples(snapshot, self.sizes, one_gpu)

    def change_cost_s(self, job: RunningJob) -> float:
        """The pause a GPU-count change costs ``job``: ``rescale_cost_s`` if set, else what the run's
        executor charges it, else ``DEFAULT_CHANGE_COST_S``."""
        if self.rescale_cost_s is not None:
            return self.rescale_cost_s
        return job.change_cost_s if job.change_cost_s is not None else DEFAULT_CHANGE_COST_S

    def _after_rescale(self, snapshot: ClusterSnapshot, goodput: np.ndarray) -> np.ndarray:
        """A running job moved to another GPU count loses its change cost in progress: over the
        R_k = min(expected remaining work / goodput(k), ``change_horizon_s``) seconds the new share
        is expected to hold, it averages goodput(k) R_k / (R_k + cost). A job near its end gains
        little from a change and pays the whole pause, and so does any job when shares turn over
        faster than its run (a batch-only change, at the same count, pays nothing)."""
        out = goodput.copy()
        if not snapshot.running:
            return out
        left = self.remaining(replace(snapshot, queued=()), goodput[: len(snapshot.running), 1])
        for i, r in enumerate(snapshot.running):
            cost = self.change_cost_s(r)
            if r.share is None or cost == 0:
                continue
            row = out[i]
            with np.errstate(divide="ignore", invalid="ignore"):
                remaining_s = np.minimum(left[i] / row, self.change_horizon_s)
                factor = np.where(row > 0, remaining_s / (remaining_s + cost), 1.0)
            factor[r.share.gpus] = 1.0
            out[i] = np.where(np.isfinite(row), row * factor, row)
        return out

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None:
        kmax = min(capacity, job.max_gpus)
        if kmax < 1:
            return None
        row = goodput_rows(job, kmax, self.noise_scale(job, 0.0), self.hosts)
        counts = range(job.min_gpus, kmax + 1) if job.elastic else (job.requested_gpus,) if job.requested_gpus <= kmax else ()
        # Scalar look-ups: admission asks this of every queued job at every decision.
        return next((k for k in counts if row.goodput[k] > -math.inf), None)


class QueueOrder(str, Enum):
    """Which queued job starts first when not all fit."""

    FIFO = "fifo"  # arrival order: the loop's admission (strict FIFO or backfill, as the loop is set)
    RESPONSE = "response"  # highest response ratio next: (waiting + predicted run) / predicted run
    SHORTEST = "shortest"  # shortest predicted run first; one that has waited its own run goes first


@dataclass(frozen=True, slots=True)
class GoodputDPQueued(GoodputDP):
    """goodput_dp starting queued jobs in its own order, strictly by default: the first that does
    not fit waits, and so do those behind it (the GPUs it would have left stay with the running
    jobs; on seed 000's trace strict beat backfill by 1-2 % of mean JCT in either order).

    A job's predicted run is its work over its best one-GPU goodput (its own model: noise scale,
    batch, accumulation). ``response`` (Brinch Hansen's HRRN) orders by (wait + run) / run.
    ``shortest`` starts the shortest predicted run first, which is what lowers the mean JCT
    without preemption (Smith's rule for one machine; SJF for many); so that a long job is not
    passed over for ever, a job that has already waited as long as its own predicted run goes
    ahead of every job that has not, oldest first (once it has waited its own run, only jobs that
    arrived before it can still start ahead of it).
    """

    order: QueueOrder = QueueOrder.SHORTEST
    strict_fifo: bool = True  # False: a later job may pass a head that does not fit (backfill)

    def predicted_run_s(self, job: JobSpec) -> float:
        """Its expected work (as ``sizes`` reads it) over its best one-GPU goodput; every job of
        unknown size predicts the same run, so those start in arrival order."""
        rate = float(goodput_rows(job, 1, self.noise_scale(job, 0.0), self.hosts).goodput[1])
        if not rate > 0:
            return math.inf
        if knowledge(job, self.sizes) is SizeKnowledge.UNKNOWN:
            return UNKNOWN_FLOOR_S
        return expected_total(job, self.sizes, rate) / rate

    def admit(self, snapshot: ClusterSnapshot, mode: OverflowMode) -> AdmissionDecision:
        def response(job: JobSpec) -> tuple:
            run = self.predicted_run_s(job)
            ratio = (max(snapshot.time - job.arrival_time, 0.0) + run) / run if math.isfinite(run) else 1.0
            return (-ratio, job.arrival_time, job.id)

        def shortest(job: JobSpec) -> tuple:
            run = self.predicted_run_s(job)
            if snapshot.time - job.arrival_time >= run:
                return (0, job.arrival_time, 0.0, job.id)  # waited its own run: oldest first
            return (1, 0.0, run, job.id)

        order = sorted(snapshot.queued, key=response if self.order is QueueOrder.RESPONSE else shortest)
        return admit_in_order(replace(snapshot, queued=tuple(order)), self, mode, strict_fifo=self.strict_fifo)


def _show(trajectory: NoiseTrajectory | None) -> str:
    if trajectory is None:
        return "none"
    return f"{trajectory.values[0]:g}" if trajectory.is_constant else f"a trajectory of {len(trajectory.values)} values"


@register("goodput_dp")
def _make(
    noise: Mapping[str, NoiseTrajectory] | None = None,
    default_noise_scale: float = math.inf,
    p: float = POWER,
    hosts: int | None = None,
    rescale_cost_s: float | None = None,
    queue: object = "shortest",
    remaining_exponent: float = REMAINING_EXPONENT,
    strict_fifo: bool = True,
    sizes: str = SizeUse.DECLARED.value,
    change_horizon_s: float = CHANGE_HORIZON_S,
) -> GoodputDP:
    try:
        order = QueueOrder(queue)
    except ValueError:
        raise ValueError(f"goodput_dp.queue={queue!r}: choose one of {', '.join(q.value for q in QueueOrder)}") from None
    common = dict(
        noise=dict(noise or {}),
        default_noise_scale=float(default_noise_scale),
        p=float(p),
        hosts=hosts,
        rescale_cost_s=None if rescale_cost_s is None else float(rescale_cost_s),
        remaining_exponent=remaining_exponent,
        sizes=sizes,
        change_horizon_s=change_horizon_s,
    )
    if not isinstance(strict_fifo, bool):
        raise ValueError(f"goodput_dp.strict_fifo={strict_fifo!r}: must be true or false")
    if order is QueueOrder.FIFO:
        return GoodputDP(**common)  # type: ignore[arg-type]
    return GoodputDPQueued(**common, order=order, strict_fifo=strict_fifo)  # type: ignore[arg-type]
