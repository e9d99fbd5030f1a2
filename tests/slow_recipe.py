"""A recipe for real-process tests whose steps must last a while: mlp_tiny, each loss 30 ms later.

The sleep sets a floor on the step time whatever the machine, so a test can rely on a job
still running after a few status reports (imported by the Dask workers as an entry point)."""

import dataclasses
import time

import torch.nn.functional as F

from elastic_tasks.examples.recipes import mlp_tiny
from elastic_tasks.recipe import TrainingRecipe

STEP_FLOOR_S = 0.03


def _slow_cross_entropy(logits, target):
    time.sleep(STEP_FLOOR_S)
    return F.cross_entropy(logits, target)


def mlp_slow() -> TrainingRecipe:
    return dataclasses.replace(mlp_tiny(), name="mlp_slow", loss_fn=_slow_cross_entropy)
