"""Measure a recipe's gradient-noise-scale trajectory: B_noise over the fraction of a training run.

One process trains the recipe the way a rank does (its model, data, optimizer and linear-
scaling LR; the trainer's sample stream and loss scaling), at global batch ``batch`` split
into micro-batches of ``micro``, for ``epochs`` epochs. The trainer's own estimator
(``elastic_tasks.rank.noise.scale.GradientNoiseProbe``, its one-rank accumulation path:
small = each micro-batch's gradient, big = the step's) measures B_noise every step; the
smoothed value is kept at ``points`` evenly spaced fractions of the run.

The result is a step trajectory (``allocator.physics.noise``): each measured value holds from halfway
to the previous point to halfway to the next, what ``malleable profile --noise`` writes into
the profile's ``noise_scale``. Measure over about the job's own length: a job takes the
trajectory over the fraction of *its* work.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from allocator.physics.noise import NoiseTrajectory
from elastic_tasks.rank.noise.scale import GradientNoiseProbe
from elastic_tasks.rank.noise.probe_schedule import SampleSchedule
from elastic_tasks.rank.data.sharding import EpochSampler
from elastic_tasks.recipe import TrainingRecipe, to_device


@dataclass(frozen=True, slots=True)
class NoiseMeasurement:
    """B_noise measured at ``fractions`` of a run of ``steps`` steps at global batch ``batch``."""

    batch: int
    micro_batch: int
    steps: int
    seconds: float
    fractions: tuple[float, ...]
    noise_scale: tuple[float, ...]
    loss: tuple[float, ...]  # mean training loss over the 20 steps before each point

    @property
    def trajectory(self) -> NoiseTrajectory:
        return NoiseTrajectory.from_points(self.fractions, self.noise_scale)


def measure_noise_trajectory(
    recipe: TrainingRecipe, batch: int, micro: int, epochs: float, points: int, seed: int = 0, device: str = "cpu"
) -> NoiseMeasurement:
    """Train ``recipe`` for ``epochs`` epochs at ``batch`` (micro-batches of ``micro``); B_noise at ``points`` fractions.

    ValueError (naming the setting) when the run is too short to measure: the estimator needs
    at least two micro-batches per step and a few steps per point.
    """
    if not (isinstance(micro, int) and 1 <= micro < batch):
        raise ValueError(f"noise micro batch={micro!r}: must be an integer in [1, batch={batch}) (two batch sizes to estimate from)")
    if not (isinstance(points, int) and points >= 1):
        raise ValueError(f"noise points={points!r}: must be a positive integer")
    steps = int(epochs * len(recipe.dataset) / batch)  # type: ignore[arg-type]
    if steps < 2 * points:
        raise ValueError(f"noise epochs={epochs!r}: {steps} steps at batch {batch} for {points} points; need at least {2 * points}")
    torch.manual_seed(seed)
    target = torch.device(device)
    model = recipe.build_model().to(target)
    optimizer = recipe.make_optimizer(model.parameters(), recipe.base_lr * batch / recipe.base_batch)
    sampler = EpochSampler(len(recipe.dataset), seed)  # type: ignore[arg-type]
    # Offline: every step is sampled (the trainer's probe samples every N-th; rank/noise/probe_schedule.py).
    probe = GradientNoiseProbe(smoothing=0.95, schedule=SampleSchedule(max_every=1, cost_budget=None))
    marks = {int(round(f * (steps - 1))): float(f) for f in np.linspace(1 / points, 1.0, points)}
    fractions, values, losses, recent = [], [], [], []
    latest = math.nan
    t0 = time.perf_counter()
    for step in range(steps):
        indices = sampler.step_indices(step * batch, batch)
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        probe.begin_step(model, world=1, micro_batches=-(-batch // micro))
        for a in range(0, batch, micro):
            chunk = [recipe.dataset[int(i)] for i in indices[a : a + micro]]
            loss, _ = recipe.loss(model, to_device(recipe.collate(chunk), target))
            (loss * (len(chunk) / batch)).backward()  # the trainer's scaling: the step's loss is the batch mean
            probe.after_micro(model, len(chunk), 1 / batch, world=1)
            loss_sum += float(loss.detach()) * len(chunk)
        value = probe.finish_step(model, batch, world=1)
        optimizer.step()
        recent = [*recent[-19:], loss_sum / batch]
        if value is not None and math.isfinite(value) and value > 0:
            latest = float(value)  # the smoothed estimate can dip below 0 early on: keep the last usable one
        if step in marks:
            fractions.append(marks[step])
            values.append(latest)
            losses.append(float(np.mean(recent)))
    if any(math.isnan(v) for v in values):
        first = next((v for v in values if not math.isnan(v)), None)
        if first is None:
            raise ValueError(f"noise batch={batch!r}: no positive noise scale estimate in {steps} steps (try a larger batch or more epochs)")
        values = [first if math.isnan(v) else v for v in values]  # points before the first estimate take it
    return NoiseMeasurement(batch, micro, steps, time.perf_counter() - t0, tuple(fractions), tuple(values), tuple(losses))
