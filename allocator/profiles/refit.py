"""Online throughput model: refit t_proc and allreduce coefficients from the steps a job reports.

Each reported step (GPUs k, micro-batch per rank c, accumulation steps s, hosts spanned h,
seconds) is one linear equation in six non-negative unknowns:

    t = s (alpha + beta c) + [k > 1] (2 (k - 1) lat_h + 2 (k - 1) / k p spp_h),  h = intra | inter

alpha + beta c is seed 000's t_proc (a per-step overhead plus a per-sample cost), lat/spp
the ring allreduce fit (``allocator.physics.throughput.t_comm``) kept separately inside one host
and across hosts (``allocator.physics.topology``). The fit is a non-negative least squares
(Lawson-Hanson), so a job needs no offline profile: it starts from a prior profile's points
(``malleable profile``, optional) or from its first steps, and every report refines it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from allocator.physics.throughput import last_micro_step, t_comm
from allocator.types import AllreduceModel, ThroughputProfile


@dataclass(frozen=True, slots=True)
class StepObservation:
    gpus: int
    micro_batch: int
    accum_steps: int
    hosts: int
    seconds: float

    def __post_init__(self) -> None:
        for name in ("gpus", "micro_batch", "accum_steps", "hosts"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"StepObservation.{name}={v!r}: must be a positive integer")
        if self.hosts > self.gpus:
            raise ValueError(f"StepObservation.hosts={self.hosts!r}: more hosts than gpus={self.gpus}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"StepObservation.seconds={self.seconds!r}: must be finite and > 0")


@dataclass(frozen=True, slots=True)
class FittedModel:
    """alpha, beta: t_proc(c) = alpha + beta c; intra/inter: allreduce fits (inter None if never seen)."""

    alpha: float
    beta: float
    intra: AllreduceModel
    inter: AllreduceModel | None
    observations: int

    def predict(self, obs: StepObservation, num_params: int) -> float:
        model = self.intra if obs.hosts == 1 or self.inter is None else self.inter
        k = obs.gpus
        comm = 0.0 if k == 1 else 2 * (k - 1) * model.latency_s + 2 * (k - 1) / k * num_params * model.seconds_per_param
        return obs.accum_steps * (self.alpha + self.beta * obs.micro_batch) + comm

    def to_profile(self, workload: str, num_params: int, max_batch_per_gpu: int, hardware: str = "refit") -> ThroughputProfile:
        """A ThroughputProfile with the fitted line sampled at powers of two up to the cap."""
        sizes = sorted({min(2**i, max_batch_per_gpu) for i in range(max_batch_per_gpu.bit_length() + 1)})
        times = [max(self.alpha + self.beta * b, 1e-9) for b in sizes]
        return ThroughputProfile(
            workload=workload,
            num_params=num_params,
            batch_sizes=tuple(sizes),
            iter_times_s=tuple(times),
            max_batch_per_gpu=max_batch_per_gpu,
            allreduce=self.intra,
            hardware=hardware,
            inter_host=self.inter,
        )


def nnls(a: np.ndarray, y: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """min |a x - y|^2 subject to x >= 0 (Lawson & Hanson 1974, active-set method)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0)) * float(np.abs(y).max(initial=0.0)))
    for _ in range(max_iter):
        w = a.T @ (y - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def _row(obs: StepObservation, num_params: int) -> list[float]:
    k, s = obs.gpus, obs.accum_steps
    ring = [2.0 * (k - 1), 2.0 * (k - 1) / k * num_params] if k > 1 else [0.0, 0.0]
    intra, inter = (ring, [0.0, 0.0]) if obs.hosts == 1 else ([0.0, 0.0], ring)
    return [float(s), float(s * obs.micro_batch), *intra, *inter]


def prior_observations(profile: ThroughputProfile) -> list[StepObservation]:
    """A profile's points as observations: the prior an online fit starts from.

    Its one-GPU points, and where it has an allreduce fit the steps it models on 2 and 4 GPUs of
    one host (and of two hosts, with an inter-host fit). Without them a job seen at a single GPU
    count k > 1 leaves the allreduce terms free: the fit would put all of a drift from the
    prior on the allreduce (and a policy would see scaling out as that much dearer); with them
    the drift is shared between compute and allreduce as the prior's points best allow.
    """
    out = [StepObservation(1, b, 1, 1, t) for b, t in zip(profile.batch_sizes, profile.iter_times_s)]
    for model, hosts in ((profile.allreduce, 1), (profile.inter_host, 2)):
        if model is None or (model.latency_s == 0 and model.seconds_per_param == 0):
            continue
        for k in (2, 4):
            comm = float(t_comm(model, profile.num_params, k))
            # The prior's own step (its overlap included): the refit sums compute and allreduce, and fits these.
            out += [StepObservation(k, b, 1, hosts, float(last_micro_step(t, comm, profile.overlap))) for b, t in zip(profile.batch_sizes, profile.iter_times_s)]
    return out


def fit_step_times(observations: Sequence[StepObservation], num_params: int, weights: Sequence[float] | None = None) -> FittedModel:
    """Weighted relative-error NNLS fit: each equation is divided by its own time, so short and
    long steps weigh alike, then multiplied by the square root of its weight."""
    if not observations:
        raise ValueError("observations=[]: need at least one reported step to fit")
    a = np.array([_row(o, num_params) for o in observations])
    y = np.array([o.seconds for o in observations])
    w = np.sqrt(np.asarray(weights, dtype=float)) if weights is not None else np.ones(len(y))
    if w.shape != y.shape or not np.all(np.isfinite(w)) or (w < 0).any():
        raise ValueError(f"weights={weights!r}: need one finite weight >= 0 per observation")
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef = nnls(a / scale * (w / y)[:, None], w) / scale
    inter_seen = any(o.hosts > 1 and o.gpus > 1 for o in observations)
    return FittedModel(
        alpha=float(coef[0]),
        beta=float(coef[1]),
        intra=AllreduceModel(float(coef[2]), float(coef[3])),
        inter=AllreduceModel(float(coef[4]), float(coef[5])) if inter_seen else None,
        observations=len(observations),
    )


class OnlineThroughputFit:
    """Accumulates a job's reported steps and refits on demand.

    The prior's points weigh ``prior_weight / (1 + steps reported)`` per measured batch size
    (its modelled multi-GPU points share that weight with its one-GPU points): alone they are the
    model; once the job reports steps its own measurements decide (a profile drifts, measured
    +-25 % between runs here, so an offline prior must not outvote the running job).

    The drift is taken as multiplicative (the machine or its load is uniformly slower or faster):
    the prior's points are scaled by the job's measured drift (the recency-weighted ratio of total
    measured to total prior-modelled step time, over the steps the prior models) before they enter
    the fit. Steps seen at one micro-batch identify one number, the line's height there; the
    prior must then supply the line's shape (per-step overhead vs per-sample cost). Unscaled, its
    absolute times pull the small-batch end toward the old speed and flatten the line: measured
    on a real run, a job 1.5x slower than its profile was refitted with no per-step overhead, and
    the policy, seeing throughput that no longer grew with the batch, ran it at batch 33
    instead of 128 (sim_vs_real_bench --refit, docs/benchmarks.md).
    """

    def __init__(
        self, num_params: int, prior: ThroughputProfile | None = None, prior_weight: float = 1.0, half_life: float | None = None
    ) -> None:
        if half_life is not None and not (half_life > 0):
            raise ValueError(f"half_life={half_life!r}: must be > 0 steps, or None (never forget)")
        self.num_params = num_params
        self._prior = prior_observations(prior) if prior is not None else []
        self._prior_model = fit_step_times(self._prior, num_params) if self._prior else None
        # The configurations the prior models: one GPU, and more where it has the allreduce fit.
        self._prior_hosts = {1} if prior is not None and any(o.gpus > 1 and o.hosts == 1 for o in self._prior) else set()
        if any(o.hosts > 1 for o in self._prior):
            self._prior_hosts.add(2)
        # The multi-GPU points added to a prior share its weight: it weighs what it did without them.
        self._prior_weight = prior_weight * len(prior.batch_sizes) / len(self._prior) if prior is not None else prior_weight
        self._half_life = half_life
        self._obs: list[StepObservation] = []

    def add(self, observations: Iterable[StepObservation]) -> None:
        self._obs.extend(observations)

    def fit(self) -> FittedModel:
        """With ``half_life`` a step reported n steps ago weighs 2^(-n / half_life): the machine
        drifts (other work, thermal, data), and recent steps say more about the next ones."""
        n = len(self._obs)
        if self._half_life is None:
            recency = [1.0] * n
        else:
            recency = list(np.exp2(-(n - 1 - np.arange(n)) / self._half_life))
        drift = self.drift(recency)
        prior = [StepObservation(o.gpus, o.micro_batch, o.accum_steps, o.hosts, o.seconds * drift) for o in self._prior]
        seen, weights = _mean_per_configuration(self._obs, recency)
        return fit_step_times(prior + seen, self.num_params, [self._prior_weight / (1 + n)] * len(prior) + weights)

    def drift(self, recency: Sequence[float] | None = None) -> float:
        """Measured over prior-modelled step time (1.0 without a prior or a step it models)."""
        if self._prior_model is None:
            return 1.0
        weights = recency if recency is not None else [1.0] * len(self._obs)
        measured = modelled = 0.0
        for o, w in zip(self._obs, weights):
            if o.gpus == 1 or min(o.hosts, 2) in self._prior_hosts:
                measured += w * o.seconds
                modelled += w * self._prior_model.predict(o, self.num_params)
        return measured / modelled if modelled > 0 else 1.0


def _mean_per_configuration(observations: Sequence[StepObservation], weights: Sequence[float]) -> tuple[list[StepObservation], list[float]]:
    """One equation per configuration: its weighted mean step time, weighing the weights' sum.

    A job's time to finish is its steps' *mean* time. Fitted one step per equation, each divided
    by its own time, the fit lands below the mean wherever step times have a long tail (a rank
    sharing its core: measured, simulated JCTs 25 % short) — relative error favours the fast
    steps. Averaging per configuration first keeps the relative weighting across configurations
    (short and long steps weigh alike) without that bias, and keeps the fit's size bounded by
    the configurations a job has run in, not its steps.
    """
    sums: dict[tuple[int, int, int, int], list[float]] = {}
    for o, w in zip(observations, weights):
        acc = sums.setdefault((o.gpus, o.micro_batch, o.accum_steps, o.hosts), [0.0, 0.0])
        acc[0] += w * o.seconds
        acc[1] += w
    rows = [(StepObservation(*key, total / weight), weight) for key, (total, weight) in sums.items() if weight > 0]
    return [r for r, _ in rows], [w for _, w in rows]
