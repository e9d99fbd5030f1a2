"""A recipe whose ranks are held once in a step until their group is aborted (issue 34.4).

On a GPU a rank whose peer was lost sits in a host sync (the step's read of its loss) on an
nccl kernel that never finishes; ``ncclCommAbort`` ends the kernel and the sync returns, with
whatever the buffers held, and the host goes on to the step's agreement. gloo has no such
kernel, so the optimizer step of ``HOLD_AT`` (after the gradient allreduce completed) waits here
until the hang watch has aborted the group — the same place in the step, the same way out.
Each held rank leaves a file named by its pid in ``$MALLEABLE_TEST_HOLD_DIR``: the test kills
one of them and the others must recover without it.
"""

import dataclasses
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from elastic_tasks.examples.recipes import mlp_tiny
from elastic_tasks.recipe import TrainingRecipe

HOLD_DIR_ENV = "MALLEABLE_TEST_HOLD_DIR"
HOLD_AT = 5  # the optimizer step (1-based) each rank is held in, once
HOLD_BOUND_S = 240.0  # a held rank whose group is never aborted fails the job after this


class HeldSGD(torch.optim.SGD):
    def __init__(self, params, lr):  # noqa: ANN001
        super().__init__(params, lr=lr, momentum=0.9)
        self.steps_taken = 0

    def step(self, closure=None):  # noqa: ANN001, ANN201
        self.steps_taken += 1
        if self.steps_taken == HOLD_AT:
            _hold()
        return super().step(closure)


def _hold() -> None:
    Path(os.environ[HOLD_DIR_ENV], str(os.getpid())).touch()
    deadline = time.monotonic() + HOLD_BOUND_S
    while dist.is_initialized():  # the abort unregisters the group
        if time.monotonic() > deadline:
            raise RuntimeError(f"held in step {HOLD_AT} for {HOLD_BOUND_S:g} s: the group was never aborted")
        time.sleep(0.02)


def held_sgd(params, lr):  # noqa: ANN001, ANN201
    return HeldSGD(params, lr)


def mlp_held() -> TrainingRecipe:
    return dataclasses.replace(mlp_tiny(), name="mlp_held", make_optimizer=held_sgd)
