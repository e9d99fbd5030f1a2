"""``tests.hosts.paced:mlp_paced``: mlp_tiny at a pace the test sets, so that a job's length follows
the test's events rather than how busy the machine's cores are.

While the file named by the workers' ``M33_PACE_FILE`` holds a number, each training forward
sleeps that many seconds per sample it computes (a GPU's time is proportional to its share of
the batch: 4 ranks step twice as fast as 2, so the policy's measured scaling stays linear);
once the test removes the file the job trains at full speed to its end. The model, the data
and every sample it trains on are mlp_tiny's.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

from torch import Tensor, nn

from elastic_tasks.examples.recipes import mlp_tiny
from elastic_tasks.recipe import TrainingRecipe

PACE_ENV = "M33_PACE_FILE"


class Paced(nn.Module):
    def __init__(self, inner: nn.Module, pace_file: str | None) -> None:
        super().__init__()
        self.inner, self.pace_file = inner, pace_file

    def forward(self, x: Tensor) -> Tensor:
        if self.training and self.pace_file:
            try:
                with open(self.pace_file) as f:
                    per_sample = float(f.read())
            except (FileNotFoundError, ValueError):
                per_sample = 0.0
            time.sleep(per_sample * x.shape[0])
        return self.inner(x)


def _build(base: TrainingRecipe) -> nn.Module:
    return Paced(base.build_model(), os.environ.get(PACE_ENV))


def mlp_paced() -> TrainingRecipe:
    base = mlp_tiny()
    return replace(base, name="mlp_paced", build_model=lambda: _build(base))
