"""Recipes whose steps are timed on the device, for gpu_validation's elastic-vs-plain-DDP checks.

Both loops (the product's rank and a plain DDP loop) build the model through the same recipe,
and the model carries a forward pre-hook that marks the start of every forward: a CUDA event
on the current stream on a GPU (the device's own timeline: what the GPU spends per step,
idle gaps included), ``perf_counter`` on CPU. A step's time is the interval between two
consecutive marks. Marks live in this module, one ``StepTimer`` per process: the rank and the
plain loop run in the same Dask worker one after the other, each after a ``timer_reset``.

The data set is held in memory (generated once from a seed, nothing downloaded) and read by
two DataLoader workers with pinned memory: on an H100 the step is the GPU's work, not the
host's collation. ``resnet_*``: the examples' ResNetish at width 48 on 3x32x32 inputs
(6.3 M parameters, 1.9 GFLOP per training sample; at batch 256 about 0.5 TFLOP per step, some
20 ms in fp32 at the ~20 TFLOP/s a ResNet-50 on 32 px reaches on an H100, see
/work/shared/reference). ``small_cpu``: the same at width 4 on 8x8, for the CPU smoke.
"""

from __future__ import annotations

import time
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from elastic_tasks.examples.models import ResNetish
from elastic_tasks.examples.recipes import sgd_momentum
from elastic_tasks.recipe import LoaderOptions, TrainingRecipe

NUM_CLASSES = 10


class InMemoryImages(Dataset):
    """``n`` random images and labels, made once from ``seed``: the same on every process."""

    def __init__(self, n: int, shape: tuple[int, ...], seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, *shape, generator=g)
        self.y = torch.randint(NUM_CLASSES, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class StepTimer:
    """Marks the start of each forward; ``intervals_ms`` between consecutive marks."""

    def __init__(self) -> None:
        self.marks: list[object] = []

    def mark(self, module: nn.Module, args: tuple[object, ...]) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].is_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        marks = self.marks
        if len(marks) < 2:
            return []
        if isinstance(marks[0], float):
            return [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]  # type: ignore[operator]
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]  # type: ignore[union-attr]


_TIMER = StepTimer()  # this process's (a benchmark's instrument, not product state)


def timer_reset() -> None:
    _TIMER.marks = []


def timer_take() -> list[float]:
    """The step intervals (ms) marked since the last reset, in order."""
    out = _TIMER.intervals_ms()
    timer_reset()
    return out


def _timed(build: partial) -> nn.Module:
    model = build()
    model.register_forward_pre_hook(_TIMER.mark)
    return model


def _recipe(name: str, width: int, shape: tuple[int, ...], n: int, precision: str, workers: int) -> TrainingRecipe:
    cuda = torch.cuda.is_available()
    return TrainingRecipe(
        name=name,
        build_model=partial(_timed, partial(ResNetish, width=width, num_classes=NUM_CLASSES)),
        dataset=InMemoryImages(n, shape),
        loss_fn=F.cross_entropy,
        make_optimizer=sgd_momentum,
        base_lr=0.05,
        base_batch=256,
        precision=precision,
        loader=LoaderOptions(num_workers=workers, pin_memory=cuda, prefetch_factor=4 if workers else None),
    )


def resnet_fp32() -> TrainingRecipe:
    return _recipe("resnet48_fp32", 48, (3, 32, 32), 8192, "fp32", 2)


def resnet_bf16() -> TrainingRecipe:
    return _recipe("resnet48_bf16", 48, (3, 32, 32), 8192, "bf16", 2)


def resnet_fp16() -> TrainingRecipe:
    return _recipe("resnet48_fp16", 48, (3, 32, 32), 8192, "fp16", 2)


def small_cpu() -> TrainingRecipe:
    return _recipe("resnet4_cpu", 4, (3, 8, 8), 1024, "fp32", 0)
