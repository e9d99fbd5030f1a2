"""Online gradient noise scale, from gradients the trainer already computes.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", Appendix A.1): a
mean gradient over b samples has E|G_b|^2 = |G|^2 + tr(Sigma) / b. Two batch sizes
b_small < b_big give unbiased estimates

    |G|^2     = (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
    tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)

and B_noise = tr(Sigma) / |G|^2 (the "simple" noise scale). Each estimate is noisy, so both
are smoothed by exponential moving averages before the ratio, as the paper advises.

Where the two batch sizes come from (``GradientNoiseProbe``), on a sampled step:
* accumulation (any world size): small = the first micro-batch's gradient, read right after
  its backward (it runs under ``no_sync``: the gradient is still this rank's own, and nothing
  has been added to it yet — no copy of any gradient needed), big = the whole step's gradient;
* several ranks, one micro-batch: small = this rank's local gradient, read by a
  post-accumulate-grad hook on each parameter as autograd produces it (before DDP's reducer
  copies it into its bucket), big = the averaged global gradient after the allreduce. The
  hooks only read, and are registered on sampled steps only: DDP's allreduce is untouched;
* one rank, one micro-batch: no second batch size, no estimate that step.

What it costs (issue 26): norms are fused (``torch._foreach_norm``, float32 results, no
float64 copies), the values stay on the device until a step later (``rank/noise/deferred.py``: no
host synchronisation on the step's path), and only every N-th step is sampled
(``SampleSchedule``). Steps whose norms are not finite (an fp16 overflow that GradScaler
skips) are left out of the averages, and norms are divided by GradScaler's loss scale.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from elastic_tasks.rank.noise.deferred import Deferred
from elastic_tasks.rank.noise.probe_schedule import SampleSchedule


@dataclass(frozen=True, slots=True)
class NoiseTerms:
    """One step's unbiased estimates of |G|^2 and tr(Sigma)."""

    grad_sq: float
    trace: float


def noise_terms(small_sq: float, b_small: float, big_sq: float, b_big: float) -> NoiseTerms:
    """The two-batch-size estimator; ``small_sq`` may be a mean over several small batches of size ``b_small``."""
    if not (0 < b_small < b_big):
        raise ValueError(f"b_small={b_small!r}, b_big={b_big!r}: need 0 < b_small < b_big")
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return NoiseTerms(grad_sq, trace)


class NoiseScaleEstimator:
    """Exponential moving averages of |G|^2 and tr(Sigma) (bias-corrected), and their ratio."""

    def __init__(self, smoothing: float = 0.95) -> None:
        if not (0.0 <= smoothing < 1.0):
            raise ValueError(f"smoothing={smoothing!r}: must be in [0, 1)")
        self.smoothing = smoothing
        self._grad_sq = 0.0
        self._trace = 0.0
        self._weight = 0.0
        self.updates = 0

    def update(self, terms: NoiseTerms) -> float | None:
        a = self.smoothing
        self._grad_sq = a * self._grad_sq + (1 - a) * terms.grad_sq
        self._trace = a * self._trace + (1 - a) * terms.trace
        self._weight = a * self._weight + (1 - a)
        self.updates += 1
        return self.value

    @property
    def grad_sq(self) -> float | None:
        return self._grad_sq / self._weight if self._weight > 0 else None

    @property
    def trace(self) -> float | None:
        return self._trace / self._weight if self._weight > 0 else None

    @property
    def value(self) -> float | None:
        """B_noise, or None before any update; inf while the averaged |G|^2 is not positive (all noise).

        None too while the averaged tr(Sigma) is not positive: the two-batch estimate of the
        variance is unbiased but noisy, and at small batches early on it reads <= 0. That says
        "no noise measured yet", not B_noise = 0 (which would tell a goodput policy that a larger
        batch is worthless); the policy keeps its model until the estimate turns positive."""
        g, t = self.grad_sq, self.trace
        if g is None or t is None:
            return None
        if g <= 0:
            return math.inf
        if t <= 0:
            return None
        return t / g


def _sq_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squares of all tensors, one fused norm kernel per dtype/device group, as a float32 0-d tensor."""
    if not tensors:
        return torch.zeros((), dtype=torch.float32)
    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)
    return torch.linalg.vector_norm(torch.stack(norms)).square()


@dataclass(frozen=True, slots=True)
class _Sample:
    """A sampled step's norms on their way to the host, and what turns them into mean-gradient norms."""

    norms: Deferred  # [small sum of squares, big sum of squares, loss scale]
    b_small: float
    b_big: float
    grad_scale: float


class GradientNoiseProbe:
    """Feeds a ``NoiseScaleEstimator`` from a training step's gradients.

    The trainer scales each micro-batch's summed loss by ``grad_scale`` (so its gradient
    contribution is grad_scale x the sum of per-sample gradients); the probe divides that
    (and GradScaler's loss scale) back out to get mean gradients. Per step: ``begin_step``
    before the first micro-batch, ``after_micro`` after each micro-batch's backward,
    ``finish_step`` after the last one (before the optimizer step).
    """

    def __init__(self, smoothing: float = 0.95, schedule: SampleSchedule | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.estimator = NoiseScaleEstimator(smoothing)
        self.schedule = schedule if schedule is not None else SampleSchedule()
        # The probe times its own work and the step (from one begin_step to the next) for the
        # schedule's cost budget; ``clock`` lets a benchmark leave its own bookkeeping out.
        self._clock = clock
        self._step_began: float | None = None
        self._spent: float | None = None  # the probe's time in the current step (None: not sampled)
        self.skipped = 0  # sampled steps left out: non-finite norms (an overflow GradScaler skipped)
        self._pending: list[_Sample] = []
        self._mode: str | None = None
        self._micro = 0
        self._small: tuple[torch.Tensor, int] | None = None
        self._local: list[torch.Tensor] = []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._local_samples = 0
        self._grad_scale = 1.0

    @property
    def value(self) -> float | None:
        return self.estimator.value

    @staticmethod
    def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
        return [p.grad for p in model.parameters() if p.grad is not None]

    def begin_step(self, model: torch.nn.Module, world: int, micro_batches: int) -> bool:
        """Decide whether this step is sampled, and how; returns whether it is."""
        now = self._clock()
        if self._step_began is not None:
            self.schedule.charge(self._spent, now - self._step_began)
        self._step_began, self._spent = now, None
        for handle in self._handles:  # left by a step that failed half-way (a collective failure)
            handle.remove()
        self._handles = []
        self._micro, self._small, self._local, self._local_samples = 0, None, [], 0
        self._mode = None
        if not self.schedule.due():
            return False
        if micro_batches > 1:
            self._mode = "first_micro"
        elif world > 1:
            self._mode = "local_hooks"
            self._handles = [p.register_post_accumulate_grad_hook(self._local_norm) for p in model.parameters() if p.requires_grad]
        if self._mode is not None:
            self._spent = self._clock() - now
        return self._mode is not None

    def _local_norm(self, p: torch.Tensor) -> None:
        """Runs as autograd accumulates each parameter's gradient, before DDP's reducer (a post
        hook of the same node) copies it for the allreduce: this rank's own gradient."""
        t0 = self._clock()
        self._local.append(torch.linalg.vector_norm(p.grad, dtype=torch.float32))
        self._charge(t0)

    def _charge(self, t0: float) -> None:
        if self._spent is not None:
            self._spent += self._clock() - t0

    def after_micro(self, model: torch.nn.Module, samples: int, grad_scale: float, world: int) -> None:
        """Record one micro-batch of ``samples`` whose backward used loss scale ``grad_scale``."""
        if self._mode == "first_micro" and self._micro == 0:
            t0 = self._clock()
            self._small = (_sq_norm(self._grads(model)), samples)
            self._charge(t0)
        self._micro += 1
        self._local_samples += samples
        self._grad_scale = grad_scale

    def finish_step(self, model: torch.nn.Module, global_batch: int, world: int, loss_scale: torch.Tensor | float | None = None) -> float | None:
        """Queue this step's norms (if sampled), fold in those that reached the host; returns the smoothed B_noise (or None)."""
        mode, self._mode = self._mode, None
        t0 = self._clock()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        small: tuple[torch.Tensor, int] | None = None
        if mode == "first_micro":
            small = self._small
        elif mode == "local_hooks" and self._local and self._local_samples < global_batch:
            small = (torch.linalg.vector_norm(torch.stack(self._local)).square(), self._local_samples)
        if small is not None and 0 < small[1] < global_batch:
            big = _sq_norm(self._grads(model))
            scale = loss_scale if isinstance(loss_scale, torch.Tensor) else torch.tensor(1.0 if loss_scale is None else float(loss_scale))
            values = torch.stack([small[0].to(big.device), big, scale.detach().reshape(()).float().to(big.device)])
            self._pending.append(_Sample(Deferred(values), small[1], global_batch, self._grad_scale))
        self._small, self._local = None, []
        self._drain()
        if mode is not None:
            self._charge(t0)
        return self.estimator.value

    def _drain(self) -> None:
        """Fold in the samples whose values reached the host (on the CPU: all of them, at once)."""
        while self._pending and self._pending[0].norms.ready():
            sample = self._pending.pop(0)
            small_sq, big_sq, loss_scale = sample.norms.values()
            small_sq /= (loss_scale * sample.grad_scale * sample.b_small) ** 2
            big_sq /= loss_scale**2
            if not (math.isfinite(small_sq) and math.isfinite(big_sq)):
                self.skipped += 1  # an overflow: GradScaler skips this step, and so do the averages
                continue
            terms = noise_terms(small_sq, sample.b_small, big_sq, sample.b_big)
            self.estimator.update(terms)
            self.schedule.observe(terms.grad_sq, terms.trace, self.estimator.grad_sq, self.estimator.trace)
