"""How often the gradient-noise probe samples a step: every N steps, N from the estimate's variance.

The scheduler reads B_noise once per decision, and B_noise itself drifts over thousands of
steps, so what matters is the estimate's error over a *horizon* of H steps, not per step.
One sample (one step's two-batch-size terms) gives the ratio B = tr(Sigma) / |G|^2 with a
relative variance that the delta method linearises as

    cv^2 = Var(tr_i / T - g_i / G)          (T, G: the running averages)

and the mean of n independent samples has relative standard error cv / sqrt(n). Sampling
every N steps gives n = H / N samples over the horizon, so the largest N that keeps the
error within ``rel_error`` is

    N = floor(H * rel_error^2 / cv^2),   clamped to [1, max_every].

Defaults: H = 2000 steps (several of the scheduler's decisions at typical step times, far
shorter than the thousands of steps over which B_noise drifts) and 10 % error on B_noise, the
agreement the probe promises with an every-step estimate (``rescale_bench``'s
``noise_scale_rel_error``). goodput's efficiency (B_noise + B0) / (B_noise + B) moves by at most
(sqrt(B) - sqrt(B0)) / (sqrt(B) + sqrt(B0)) of B_noise's relative error (its elasticity, largest
at B_noise = sqrt(B0 B)): under 0.5 for batch ranges up to 8x, so under 5 % on efficiency.
Measured on ``mlp_tiny`` (cv^2 ~ 80): at 20 % the probe sampled every 8th step and its estimate
was 39 % off the every-step one over 200 steps; at 10 % it samples every step there, and
steadier jobs (cv^2 < 2.5) still sample every 8th.

cv^2 is measured from the samples themselves (their mean squared residual); the first
``warmup`` samples are taken every step, before anything is known. A noisy estimate (large
cv) is thus sampled every step; a steady one as rarely as every ``max_every`` steps, where
the probe's cost is 1/max_every of a sampled step's.

A cost budget bounds N from below: the probe times its own work on a sampled step (the norms,
on the host: on a GPU that is their launch, the kernels themselves are microseconds) and the
schedule keeps the average below ``cost_budget`` of the step time,

    N >= ceil(probe_s / (cost_budget * step_s)),

so what users pay for the probe is known up front (1 % by default). Until the estimate first
reads as a finite positive B_noise (both averages positive; at least ``cost_warmup`` and at
most ``max_cost_warmup`` samples) every step is sampled whatever it costs, so that a job has a
usable estimate as soon as an every-step probe would; the budget thins the samples after that. Where the variance would
want more samples than the budget allows, the budget wins and ``expected_rel_error`` says what
that costs in accuracy over the horizon. On a GPU the budget never binds; on a CPU, where the
norms are memory-bound passes over every gradient, it does for large models (``alexnet_10m``:
two passes of ~40 MB against a ~140 ms step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class SampleSchedule:
    horizon_steps: int = 2000
    rel_error: float = 0.1
    max_every: int = 8
    warmup: int = 16
    cost_budget: float | None = 0.01  # the probe's average share of the step time; None: no bound
    max_every_for_cost: int = 64  # the budget never thins samples beyond this
    cost_warmup: int = 4  # sampled every step at first, until the estimate is usable (at least these)
    max_cost_warmup: int = 64  # ... and at most these, if it never is
    samples: int = 0
    _sampled: int = 0
    _estimated: bool = False  # both averages positive once: B_noise reads as a finite number
    _variance_every: int = 1
    _cost_every: int = 1
    _residual_sq: float = 0.0
    _since: int = 1 << 30  # steps since the last sample: the first step is sampled
    _probe_s: float | None = None  # moving averages of a sampled step's probe time and of a step's time
    _step_s: float | None = None

    def __post_init__(self) -> None:
        if self.horizon_steps < 1 or self.max_every < 1 or self.warmup < 0 or self.max_every_for_cost < 1 or not 0 <= self.cost_warmup <= self.max_cost_warmup:
            raise ValueError(
                f"SampleSchedule: horizon_steps={self.horizon_steps!r}, max_every={self.max_every!r}, "
                f"warmup={self.warmup!r}, max_every_for_cost={self.max_every_for_cost!r}, "
                f"cost_warmup={self.cost_warmup!r}, max_cost_warmup={self.max_cost_warmup!r} (need 0 <= cost_warmup <= max_cost_warmup)"
            )
        if not (0 < self.rel_error < 1):
            raise ValueError(f"SampleSchedule.rel_error={self.rel_error!r}: must be in (0, 1)")
        if self.cost_budget is not None and not (0 < self.cost_budget <= 1):
            raise ValueError(f"SampleSchedule.cost_budget={self.cost_budget!r}: must be in (0, 1] or None")

    @property
    def every(self) -> int:
        """Sample every N-th step: the variance's N, or more where the cost budget needs it."""
        if self._sampled < self.cost_warmup or (not self._estimated and self._sampled < self.max_cost_warmup):
            return self._variance_every
        return max(self._variance_every, self._cost_every)

    def due(self) -> bool:
        """Called once per step: whether this step is sampled."""
        self._since += 1
        if self._since >= self.every:
            self._since = 0
            self._sampled += 1
            return True
        return False

    def charge(self, probe_s: float | None, step_s: float) -> None:
        """A step took ``step_s``; if it was sampled, the probe's own work in it took ``probe_s``."""
        if step_s <= 0 or not math.isfinite(step_s):
            return
        # What the step costs without the probe: what users would pay with it off.
        base = step_s - (probe_s if probe_s is not None and probe_s >= 0 else 0.0)
        if base <= 0:
            return
        if self._step_s is not None and base > 10 * self._step_s:
            return  # a pause between steps (an evaluation, a regroup), not what a step costs
        self._step_s = base if self._step_s is None else 0.9 * self._step_s + 0.1 * base
        if probe_s is not None and probe_s >= 0:
            self._probe_s = probe_s if self._probe_s is None else 0.9 * self._probe_s + 0.1 * probe_s
        if self.cost_budget is None or self._probe_s is None:
            return
        needed = math.ceil(self._probe_s / (self.cost_budget * self._step_s) - 1e-9)
        self._cost_every = int(max(1, min(self.max_every_for_cost, needed)))

    @property
    def probe_share(self) -> float | None:
        """The probe's average cost at the current N, as a share of the step without it (None before it was timed)."""
        if self._probe_s is None or not self._step_s:
            return None
        return self._probe_s / self.every / self._step_s

    @property
    def expected_rel_error(self) -> float | None:
        """The estimate's relative standard error over the horizon at the current N (delta method)."""
        cv_sq = self.cv_sq
        return None if cv_sq is None else math.sqrt(cv_sq * self.every / self.horizon_steps)

    @property
    def cv_sq(self) -> float | None:
        return self._residual_sq / self.samples if self.samples else None

    def observe(self, grad_sq: float, trace: float, grad_sq_avg: float | None, trace_avg: float | None) -> None:
        """One sample's terms, against the running averages; adapts ``every``."""
        if grad_sq_avg is None or trace_avg is None or grad_sq_avg <= 0 or trace_avg <= 0:
            return  # no meaningful ratio yet: keep sampling as before
        self._estimated = True
        residual = trace / trace_avg - grad_sq / grad_sq_avg
        self._residual_sq += residual * residual
        self.samples += 1
        if self.samples < self.warmup:
            return
        cv_sq = self._residual_sq / self.samples
        allowed = self.horizon_steps * self.rel_error**2 / cv_sq if cv_sq > 0 else math.inf
        self._variance_every = int(max(1, min(self.max_every, math.floor(allowed) if math.isfinite(allowed) else self.max_every)))
