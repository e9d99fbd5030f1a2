"""Check a recipe on one batch before any cluster starts: a mismatch is one line naming the field.

Without this a dataset of dict samples under the ``(x, y)`` contract failed only once the
ranks ran, as ``KeyError: 0`` plus a monitor thread's traceback. Here two samples are read,
collated, run forward and backward and stepped on the CPU, each stage blamed on the recipe
field that feeds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from elastic_tasks.recipe import EntryPointError, TrainingRecipe
from elastic_tasks.rank.step import autocast

T = TypeVar("T")


class RecipeCheckError(EntryPointError):
    """The recipe loaded but cannot train one step; the message names the field."""


def _blame(recipe: TrainingRecipe, field: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except RecipeCheckError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of user code is reported against its field
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise RecipeCheckError(f"TrainingRecipe[{recipe.name}].{field}: {detail}") from None


def _check_pair(recipe: TrainingRecipe, sample: Any, where: str) -> None:
    """The ``(x, y)`` contract needs a two-item sequence; anything else needs a step_fn."""
    if recipe.step_fn is None and (isinstance(sample, (str, bytes, Mapping)) or not isinstance(sample, Sequence) or len(sample) != 2):
        raise RecipeCheckError(
            f"TrainingRecipe[{recipe.name}].{where}: a {type(sample).__name__} sample, but loss_fn recipes need (input, label) pairs; "
            "give step_fn(model, batch) -> loss for other batch structures"
        )


def check_recipe(recipe: TrainingRecipe) -> None:
    """One forward/backward/optimizer step on two samples (CPU, the recipe's precision)."""
    n = len(recipe.dataset)  # type: ignore[arg-type]
    samples = [_blame(recipe, f"dataset[{i}]", lambda i=i: recipe.dataset[i]) for i in sorted({0, min(1, n - 1)})]
    _check_pair(recipe, samples[0], "dataset[0]")
    batch = _blame(recipe, "collate_fn", lambda: recipe.collate(samples))
    model = _blame(recipe, "build_model", recipe.build_model)
    optimizer = _blame(recipe, "make_optimizer", lambda: recipe.make_optimizer(model.parameters(), recipe.base_lr))
    field = "step_fn" if recipe.step_fn is not None else "loss_fn"
    device = torch.device("cpu")

    def forward_backward() -> None:
        with autocast(recipe.precision, device):
            loss, _ = recipe.loss(model, batch)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
            raise RecipeCheckError(f"TrainingRecipe[{recipe.name}].{field}: returned {type(loss).__name__} {_shape(loss)}, expected a scalar loss tensor with a gradient")
        if not torch.isfinite(loss.detach()).all():
            raise RecipeCheckError(f"TrainingRecipe[{recipe.name}].{field}: loss on dataset[0:2] is {float(loss)}")
        loss.float().backward()

    _blame(recipe, field, forward_backward)
    _blame(recipe, "make_optimizer", optimizer.step)
    if recipe.eval_dataset is not None:
        sample = _blame(recipe, "eval_dataset[0]", lambda: recipe.eval_dataset[0])  # type: ignore[index]
        _check_pair(recipe, sample, "eval_dataset[0]")
        if recipe.eval_metrics is not None:
            eval_batch = _blame(recipe, "collate_fn", lambda: recipe.collate([sample]))
            with torch.no_grad():
                metrics = _blame(recipe, "eval_metrics", lambda: dict(recipe.eval_metrics(model, eval_batch)))  # type: ignore[misc]
            bad = [k for k, v in metrics.items() if not isinstance(k, str) or not isinstance(v, (int, float, torch.Tensor))]
            if bad:
                raise RecipeCheckError(f"TrainingRecipe[{recipe.name}].eval_metrics: keys {bad!r} are not str -> number")


def _shape(value: object) -> str:
    return f"of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
