"""The recipe's step as one module, so that DDP wraps the whole step, not the model.

``step_fn(model, batch)`` is always handed the module ``build_model`` returned — in the
pre-flight check, in training and in evaluation — never the ``DistributedDataParallel``
wrapper (whose missing attributes broke ``model.compute_loss(batch)`` on the ranks only).
DDP must still see the forward to prepare the gradient allreduce, so the trainer wraps
``RecipeStep(model, recipe)`` instead: DDP's forward calls this module's forward, which
runs the user's step on the raw model. Lightning runs ``training_step`` inside DDP the same
way. The parameters are the model's own (same tensors, same order), so the optimizer, the
state broadcast and the checkpoints see the model as the user built it.

``rank_ddp`` builds that wrapper the same way on every torch we meet: torch 2.13 renamed
``broadcast_buffers`` to ``forward_sync_buffers`` (the old name deprecated there), and the GPU
images teams run carry older releases (2.11 on the lent H200 raised ``TypeError`` on the new
name, failing every rank), so the keyword is the one the installed DDP accepts.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.recipe import TrainingRecipe


class RecipeStep(nn.Module):
    def __init__(self, model: nn.Module, recipe: TrainingRecipe) -> None:
        super().__init__()
        self.model = model
        self.recipe = recipe

    def forward(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch's mean loss and, for ``(x, y)`` classifiers, its correct count."""
        return self.recipe.loss(self._modules["model"], batch)  # ``self.model`` is nn.Module.__getattr__: a Python call per step


def no_forward_buffer_sync(accepted: Collection[str]) -> dict[str, bool]:
    """The keyword that turns off DDP's buffer broadcast before each forward, for a DDP whose
    ``__init__`` accepts the parameter names ``accepted``."""
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in accepted else {"broadcast_buffers": False}


_NO_BUFFER_SYNC = no_forward_buffer_sync(inspect.signature(DistributedDataParallel.__init__).parameters)


def rank_ddp(model: nn.Module, recipe: TrainingRecipe) -> DistributedDataParallel:
    """The recipe's step on ``model`` under DDP as a rank trains it: no set-up sync (the state was
    already agreed: loaded, or broadcast from a survivor) and no per-forward buffer broadcast."""
    return DistributedDataParallel(RecipeStep(model, recipe), init_sync=False, **_NO_BUFFER_SYNC)
