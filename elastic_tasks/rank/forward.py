"""The recipe's step as one module, so that DDP wraps the whole step, not the model.

``step_fn(model, batch)`` is always handed the module ``build_model`` returned — in the
pre-flight check, in training and in evaluation — never the ``DistributedDataParallel``
wrapper (whose missing attributes broke ``model.compute_loss(batch)`` on the ranks only).
DDP must still see the forward to prepare the gradient allreduce, so the trainer wraps
``RecipeStep(model, recipe)`` instead: DDP's forward calls this module's forward, which
runs the user's step on the raw model. Lightning runs ``training_step`` inside DDP the same
way. The parameters are the model's own (same tensors, same order), so the optimizer, the
state broadcast and the checkpoints see the model as the user built it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from elastic_tasks.recipe import TrainingRecipe


class RecipeStep(nn.Module):
    def __init__(self, model: nn.Module, recipe: TrainingRecipe) -> None:
        super().__init__()
        self.model = model
        self.recipe = recipe

    def forward(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch's mean loss and, for ``(x, y)`` classifiers, its correct count."""
        return self.recipe.loss(self._modules["model"], batch)  # ``self.model`` is nn.Module.__getattr__: a Python call per step
