"""Online gradient noise scale, from gradients the trainer already computes.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", Appendix A.1): a
mean gradient over b samples has E|G_b|^2 = |G|^2 + tr(Sigma) / b. Two batch sizes
b_small < b_big give unbiased estimates

    |G|^2     = (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
    tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)

and B_noise = tr(Sigma) / |G|^2 (the "simple" noise scale). Each estimate is noisy, so both
are smoothed by exponential moving averages before the ratio, as the paper advises.

Where the two batch sizes come from (``GradientNoiseProbe``):
* several ranks: small = this rank's local batch gradient (read in a DDP communication hook,
  before the allreduce), big = the averaged global gradient after it;
* one rank with accumulation: small = each micro-batch's gradient (difference of the
  accumulated gradients), big = the whole step's gradient;
* one rank, one micro-batch: no second batch size, no estimate that step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook


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
        """B_noise, or None before any update; inf while the averaged |G|^2 is not positive (all noise)."""
        g, t = self.grad_sq, self.trace
        if g is None or t is None:
            return None
        if g <= 0:
            return math.inf
        return max(t, 0.0) / g


def _sq_norm(tensors: list[torch.Tensor]) -> float:
    return float(sum(t.detach().double().pow(2).sum() for t in tensors)) if tensors else 0.0


class GradientNoiseProbe:
    """Feeds a ``NoiseScaleEstimator`` from a training step's gradients.

    The trainer scales each micro-batch's summed loss by ``grad_scale`` (so its gradient
    contribution is grad_scale x the sum of per-sample gradients); the probe divides that
    back out to get mean gradients. Call ``attach`` on every new DDP wrapper, ``after_micro``
    after each micro-batch's backward, ``finish_step`` after the last one (before the
    optimizer step).
    """

    def __init__(self, smoothing: float = 0.95) -> None:
        self.estimator = NoiseScaleEstimator(smoothing)
        self._local_sq: torch.Tensor | None = None
        self._micro_sq: list[tuple[float, int]] = []
        self._previous: list[torch.Tensor] | None = None
        self._local_samples = 0
        self._grad_scale = 1.0

    @property
    def value(self) -> float | None:
        return self.estimator.value

    def attach(self, ddp: torch.nn.parallel.DistributedDataParallel, wrap: Callable[[Callable], Callable] | None = None) -> None:
        """Read this rank's local gradient in DDP's communication hook, then allreduce as DDP would.

        ``wrap`` decorates the hook (the trainer's ``collective.HookWitness`` watches the allreduce).
        """
        group = ddp.process_group if hasattr(ddp, "process_group") else dist.group.WORLD

        # Unannotated on purpose: DDP checks hook annotations, which this module's postponed
        # annotations would turn into strings.
        def hook(state, bucket):  # type: ignore[no-untyped-def]
            sq = bucket.buffer().detach().double().pow(2).sum()
            self._local_sq = sq if self._local_sq is None else self._local_sq + sq
            return allreduce_hook(group, bucket)

        ddp.register_comm_hook(None, hook if wrap is None else wrap(hook))

    def _grads(self, model: torch.nn.Module) -> list[torch.Tensor]:
        return [p.grad for p in model.parameters() if p.grad is not None]

    def after_micro(self, model: torch.nn.Module, samples: int, grad_scale: float, world: int) -> None:
        """Record one micro-batch of ``samples`` whose backward used loss scale ``grad_scale``."""
        self._local_samples += samples
        self._grad_scale = grad_scale
        if world > 1:
            return  # the local batch is the small batch; read in the hook
        grads = self._grads(model)
        previous = self._previous
        diff = grads if previous is None else [g - p for g, p in zip(grads, previous)]
        self._micro_sq.append((_sq_norm(diff) / (grad_scale * samples) ** 2, samples))
        self._previous = [g.detach().clone() for g in grads]

    def finish_step(self, model: torch.nn.Module, global_batch: int, world: int) -> float | None:
        """Update the estimate with this step's gradients; returns the smoothed B_noise (or None)."""
        big_sq = _sq_norm(self._grads(model))  # after DDP: the global mean gradient
        try:
            if world > 1 and self._local_sq is not None and self._local_samples < global_batch:
                local = self._local_samples
                small_sq = float(self._local_sq) / (self._grad_scale * local) ** 2
                return self.estimator.update(noise_terms(small_sq, local, big_sq, global_batch))
            if world == 1 and len(self._micro_sq) > 1:
                # Micro-batches may differ by one sample; their mean size is the small batch.
                small_sq = sum(sq for sq, _ in self._micro_sq) / len(self._micro_sq)
                b_small = sum(n for _, n in self._micro_sq) / len(self._micro_sq)
                return self.estimator.update(noise_terms(small_sq, b_small, big_sq, global_batch))
            return self.estimator.value
        finally:
            self._local_sq, self._micro_sq, self._previous, self._local_samples = None, [], None, 0
