"""Hybrid scaling (seed 002): batch and learning rate follow the world size; accumulation
keeps the global batch when memory caps the per-GPU batch.

* The learning rate starts at the linear-scaling value ``base_lr * batch / base_batch``.
* When the global batch changes by a factor k, the LR moves from its current value lr_0 to
  ``lr_T = target * k`` linearly over T iterations (seed 002, Eq. 3), so a sharp jump does
  not make the model diverge.
* The loss on each rank is ``sum(local losses) / global_batch`` and gradients are summed
  across ranks, so the update does not depend on how the global batch is split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from elastic_tasks.protocol import check_batch


@dataclass(frozen=True, slots=True)
class LRRamp:
    """Learning rate as a function of the global step: ``start`` -> ``target`` over ``steps`` from ``begin``."""

    start: float
    target: float
    begin: int = 0
    steps: int = 0

    def __post_init__(self) -> None:
        for name in ("start", "target"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"LRRamp.{name}={value!r}: must be a finite number > 0")
        if not (isinstance(self.begin, int) and self.begin >= 0):
            raise ValueError(f"LRRamp.begin={self.begin!r}: must be an integer >= 0")
        if not (isinstance(self.steps, int) and self.steps >= 0):
            raise ValueError(f"LRRamp.steps={self.steps!r}: must be an integer >= 0")

    def at(self, step: int) -> float:
        if self.steps == 0 or step >= self.begin + self.steps:
            return self.target
        if step <= self.begin:
            return self.start
        return self.start + (step - self.begin) / self.steps * (self.target - self.start)


def initial_lr(base_lr: float, base_batch: int, global_batch: int) -> LRRamp:
    """The linear-scaling LR for the first global batch (no ramp: nothing to move away from)."""
    check_batch(global_batch)
    lr = base_lr * global_batch / base_batch
    return LRRamp(lr, lr)


def rescale_lr(current: LRRamp, step: int, old_batch: int, new_batch: int, ramp_steps: int) -> LRRamp:
    """Seed 002's progressive linear scaling when the global batch goes old -> new at ``step``."""
    check_batch(new_batch)
    if new_batch == old_batch:
        return current
    return LRRamp(current.at(step), current.target * new_batch / old_batch, begin=step, steps=ramp_steps)


def accumulation_steps(global_batch: int, world_size: int, max_batch_per_gpu: int | None) -> int:
    """Micro-steps per step so that no rank's micro-batch exceeds the memory cap."""
    check_batch(global_batch, world_size)
    if max_batch_per_gpu is None:
        return 1
    if not (isinstance(max_batch_per_gpu, int) and max_batch_per_gpu >= 1):
        raise ValueError(f"max_batch_per_gpu={max_batch_per_gpu!r}: must be a positive integer")
    largest_local = -(-global_batch // world_size)
    return -(-largest_local // max_batch_per_gpu)


def plan_accumulation(planned: int | None, global_batch: int, world_size: int, max_batch_per_gpu: int | None) -> int:
    """Micro-steps per step for a generation: the policy's ``Share.accum_steps`` as the plan
    carries it, checked against the batch and the memory cap; None (a plan no policy decided:
    ``malleable train``, recovery) falls back to the smallest that fits the cap."""
    if planned is None:
        return accumulation_steps(global_batch, world_size, max_batch_per_gpu)
    check_batch(global_batch, world_size)
    if not (isinstance(planned, int) and not isinstance(planned, bool) and planned >= 1):
        raise ValueError(f"Plan.accum_steps={planned!r}: must be an integer >= 1 or None")
    if global_batch < world_size * planned:
        raise ValueError(f"Plan.accum_steps={planned!r}: global batch {global_batch} leaves some of {world_size} GPUs x {planned} micro-steps no sample")
    largest_local = -(-global_batch // world_size)
    micro = -(-largest_local // planned)
    if max_batch_per_gpu is not None and micro > max_batch_per_gpu:
        raise ValueError(
            f"Plan.accum_steps={planned!r}: micro-batches of {micro} on {world_size} GPU(s) at global batch {global_batch} exceed max_batch_per_gpu={max_batch_per_gpu}"
        )
    return planned


def micro_batches(count: int, accum: int) -> list[tuple[int, int]]:
    """Split ``count`` local samples into at most ``accum`` non-empty [start, stop) chunks."""
    if accum < 1:
        raise ValueError(f"accum={accum!r}: must be >= 1")
    base, extra = divmod(count, accum)
    out, start = [], 0
    for i in range(accum):
        size = base + (1 if i < extra else 0)
        if size:
            out.append((start, start + size))
            start += size
    return out


def loss_weight(samples: int, global_batch: int) -> float:
    """What a micro-batch's mean loss is multiplied by before backward: its share of the global batch.

    The gradient allreduce is a plain SUM (``rank/health/gradient_hook.py``), so the update is
    sum over ranks and micro-batches of (samples / global batch) x mean gradient = the global
    batch's mean gradient, however unevenly the batch is split (the first ``batch % world``
    ranks take one sample more; accumulation splits a rank's share again)."""
    return samples / global_batch
