"""Learning rates as a plain loop has them, scaled by the system without being overwritten.

Each parameter group keeps its *own* LR in ``group["lr"]`` — the value the user's optimizer
and ``torch.optim.lr_scheduler`` set and read (OneCycleLR, cosine, ReduceLROnPlateau's
reductions, per-group ratios). The system's factor (hybrid batch scaling times the older
``lr_schedule`` factor) is applied only for the duration of ``optimizer.step()`` and taken
off again, so a scheduler that computes its next LR from the current one never compounds
it, and what travels in the optimizer's state (broadcast, checkpoints) is the user's LR.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau

from elastic_tasks.recipe import TrainingRecipe


class SchedulerMetricError(ValueError):
    """A metric-driven scheduler was fed by an evaluation that did not return its metric."""


def lr_factor(recipe: TrainingRecipe, batch_scaled_lr: float, samples_seen: int) -> float:
    """The system's multiplier on every group's own LR at this step.

    ``batch_scaled_lr`` is what hybrid scaling gives for ``base_lr`` (``scaling.LRRamp``); the
    factor is its ratio to ``base_lr``, times the recipe's ``lr_schedule`` by samples seen.
    """
    schedule = 1.0 if recipe.lr_schedule is None else float(recipe.lr_schedule(samples_seen))
    if not (math.isfinite(schedule) and schedule >= 0):
        raise ValueError(f"TrainingRecipe[{recipe.name}].lr_schedule({samples_seen})={schedule!r}: must be a number >= 0")
    return batch_scaled_lr / float(recipe.base_lr) * schedule  # type: ignore[arg-type]


def group_lrs(optimizer: torch.optim.Optimizer) -> tuple[float, ...]:
    return tuple([float(group["lr"]) for group in optimizer.param_groups])


def scaled_lrs(optimizer: torch.optim.Optimizer, factor: float) -> _ScaledLRs:
    """Every group's LR times ``factor`` inside the block (the LRs applied are what ``with`` gives);
    each group's own LR is back afterwards, whatever happened inside."""
    return _ScaledLRs(optimizer, factor)


class _ScaledLRs:
    """``scaled_lrs``'s block: a class, not a generator (it runs every step). A factor of 1 leaves
    the groups as they are: ``lr * 1.0 == lr``, nothing to write or put back."""

    __slots__ = ("_optimizer", "_factor", "_own")

    def __init__(self, optimizer: torch.optim.Optimizer, factor: float) -> None:
        self._optimizer, self._factor = optimizer, factor
        self._own: tuple[float, ...] | None = None

    def __enter__(self) -> tuple[float, ...]:
        own = group_lrs(self._optimizer)
        if self._factor == 1.0:
            return own
        applied = tuple(lr * self._factor for lr in own)
        self._own = own
        for group, lr in zip(self._optimizer.param_groups, applied, strict=True):
            group["lr"] = lr
        return applied

    def __exit__(self, *exc: object) -> None:
        if self._own is not None:
            for group, lr in zip(self._optimizer.param_groups, self._own, strict=True):
                group["lr"] = lr


def is_metric_driven(scheduler: Any) -> bool:
    return isinstance(scheduler, ReduceLROnPlateau)


def after_step(scheduler: Any) -> None:
    """A per-step scheduler steps once per optimizer step, as in a plain loop."""
    if scheduler is not None and not is_metric_driven(scheduler):
        scheduler.step()


def after_evaluation(recipe: TrainingRecipe, scheduler: Any, metrics: Mapping[str, float]) -> None:
    """A metric-driven scheduler (``ReduceLROnPlateau``) steps on ``recipe.scheduler_metric``."""
    if scheduler is None or not is_metric_driven(scheduler):
        return
    if recipe.scheduler_metric not in metrics:
        raise SchedulerMetricError(
            f"TrainingRecipe[{recipe.name}].scheduler_metric={recipe.scheduler_metric!r}: the evaluation returned "
            f"{sorted(metrics)}; return that metric from eval_fn or name one of these"
        )
    scheduler.step(float(metrics[recipe.scheduler_metric]))
