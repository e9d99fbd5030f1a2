"""The final evaluation of a job on rank 0: loss, accuracy where it applies, the recipe's metrics."""

from __future__ import annotations

import torch
from torch import nn

from elastic_tasks.protocol import EvalResult
from elastic_tasks.recipe import TrainingRecipe, to_device
from elastic_tasks.rank.step import autocast

EVAL_BATCH = 256


def evaluate(recipe: TrainingRecipe, model: nn.Module, device: torch.device, batch_size: int = EVAL_BATCH) -> EvalResult:
    """Sample-weighted means over ``recipe.eval_dataset`` in order; accuracy only for ``(x, y)`` classifiers."""
    dataset = recipe.eval_dataset
    if dataset is None:
        raise ValueError(f"TrainingRecipe[{recipe.name}].eval_dataset=None: nothing to evaluate")
    n = len(dataset)  # type: ignore[arg-type]
    was_training = model.training
    model.eval()
    total_loss, total_correct, counted = 0.0, 0.0, False
    metrics: dict[str, float] = {}
    try:
        with torch.no_grad(), autocast(recipe.precision, device):
            for start in range(0, n, batch_size):
                size = min(n, start + batch_size) - start
                batch = to_device(recipe.collate([dataset[i] for i in range(start, start + size)]), device)
                loss, correct = recipe.loss(model, batch)
                total_loss += float(loss) * size
                if correct is not None:
                    total_correct, counted = total_correct + float(correct), True
                if recipe.eval_metrics is not None:
                    for name, value in recipe.eval_metrics(model, batch).items():
                        metrics[name] = metrics.get(name, 0.0) + float(value) * size
    finally:
        model.train(was_training)
    return EvalResult(total_loss / n, total_correct / n if counted else None, n, tuple(sorted((k, v / n) for k, v in metrics.items())))
