"""Job-specific figures: the median time of one training iteration at a batch, and the
largest per-GPU batch that fits in device memory."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from elastic_tasks.profiling.settings import ProfilerError
from elastic_tasks.recipe import TrainingRecipe, build_optimizer, to_device
from elastic_tasks.rank.step import autocast


def trainable_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _sample_batch(recipe: TrainingRecipe, batch: int, device: torch.device, start: int = 0) -> Any:
    """``batch`` samples from index ``start`` (cycling a small data set), collated as a rank does, on ``device``."""
    n = len(recipe.dataset)  # type: ignore[arg-type]
    return to_device(recipe.collate([recipe.dataset[(start + i) % n] for i in range(batch)]), device)


class Stepper:
    """One model and optimizer on one device; ``step(b)`` runs a training iteration at batch b."""

    def __init__(self, recipe: TrainingRecipe, device: torch.device, include_data: bool = False) -> None:
        torch.manual_seed(0)
        self.recipe = recipe
        self.device = device
        self.include_data = include_data
        self._cursor = 0  # where the next fresh batch starts, so no two steps reuse one
        self.model = recipe.build_model().to(device).train()
        self.optimizer = build_optimizer(recipe, self.model)
        self._batches: dict[int, Any] = {}

    def batch(self, b: int) -> Any:
        if b not in self._batches:
            self._batches = {b: _sample_batch(self.recipe, b, self.device)}  # hold one size at a time
        return self._batches[b]

    def step(self, b: int) -> None:
        if self.include_data:
            data = _sample_batch(self.recipe, b, self.device, self._cursor)
            self._cursor += b
        else:
            data = self.batch(b)
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.recipe.precision, self.device):  # the precision the ranks train in
            loss, _ = self.recipe.loss(self.model, data)
        loss.float().backward()
        self.optimizer.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def release(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._batches = {}
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def time_iterations(stepper: Stepper, batch: int, warmup: int, repeats: int) -> float:
    """Median seconds of one forward+backward+step at ``batch``, after ``warmup`` untimed steps.

    Data preparation is inside the timed region only when the stepper was built with
    ``include_data`` (seed 000's t_proc is processing time; our ranks also collate).
    """
    if not stepper.include_data:
        stepper.batch(batch)
    for _ in range(warmup):
        stepper.step(batch)
    stepper.sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        stepper.step(batch)
        stepper.sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def largest_fitting_batch(fits: Callable[[int], bool], start: int, limit: int) -> int:
    """The largest b in [start, limit] with ``fits(b)``, assuming fitting is monotone in b.

    Doubles from ``start`` until a batch fails (or ``limit``), then bisects between the last
    success and the first failure: O(log limit) trial iterations.
    """
    if not (0 < start <= limit):
        raise ValueError(f"largest_fitting_batch: start={start!r} must lie in [1, limit={limit}]")
    if not fits(start):
        raise ProfilerError(f"batch_per_gpu={start}: does not fit in device memory")
    good, bad = start, None
    while bad is None and good < limit:
        trial = min(2 * good, limit)
        if fits(trial):
            good = trial
        else:
            bad = trial
    if bad is None:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def cuda_fits(stepper: Stepper) -> Callable[[int], bool]:
    def fits(b: int) -> bool:
        try:
            stepper.step(b)
            stepper.sync()
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            stepper.release()

    return fits
