"""Check a recipe on one batch before any cluster starts: a mismatch is one line naming the field.

Without this a dataset of dict samples under the ``(x, y)`` contract failed only once the
ranks ran, as ``KeyError: 0`` plus a monitor thread's traceback. Here two samples are read,
collated, run forward and backward and stepped on the device the ranks will use, what the
ranks' DataLoader workers will pickle is pickled, and the evaluation runs on two samples;
each stage is blamed on the recipe field that feeds it. ``malleable train --no-preflight``
skips it (e.g. a model that only builds where the ranks run).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.reduction import ForkingPickler
from typing import Any, TypeVar

import torch
from torch.utils.data import Subset

from elastic_tasks.rank import lr as lrs
from elastic_tasks.rank.evaluation.evaluate import EvalLoader, evaluate
from elastic_tasks.rank.forward import RecipeStep
from elastic_tasks.rank.step import autocast
from elastic_tasks.recipe import EntryPointError, TrainingRecipe, build_optimizer, load_entry_point, to_device

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


def preflight_device() -> torch.device:
    """Where the ranks of a local job will train: the first GPU when there is one, else the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def check_recipe(recipe: TrainingRecipe, device: torch.device | None = None) -> None:
    """One step as a rank takes it, on ``device`` (default: ``preflight_device()``), before any cluster starts.

    Two samples are read, collated, moved to the device and run through the recipe's step as
    the ranks run it (``RecipeStep``: the same model object ``step_fn`` gets there); backward,
    the optimizer step with the system's LR factor, the scheduler; then what the ranks'
    DataLoader workers will pickle, and ``eval_fn`` on two eval samples.
    """
    device = preflight_device() if device is None else device
    n = len(recipe.dataset)  # type: ignore[arg-type]
    samples = [_blame(recipe, f"dataset[{i}]", lambda i=i: recipe.dataset[i]) for i in sorted({0, min(1, n - 1)})]
    _check_pair(recipe, samples[0], "dataset[0]")
    batch = _blame(recipe, "collate_fn", lambda: to_device(recipe.collate(samples), device))
    check_picklable(recipe)
    model = _blame(recipe, "build_model", lambda: recipe.build_model().to(device))
    optimizer = _blame(recipe, "make_optimizer", lambda: build_optimizer(recipe, model))
    scheduler = _blame(recipe, "make_scheduler", lambda: recipe.make_scheduler(optimizer)) if recipe.make_scheduler is not None else None
    field = "step_fn" if recipe.step_fn is not None else "loss_fn"
    step = RecipeStep(model, recipe)

    def forward_backward() -> None:
        with autocast(recipe.precision, device):
            loss, _ = step(batch)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
            raise RecipeCheckError(f"TrainingRecipe[{recipe.name}].{field}: returned {type(loss).__name__} {_shape(loss)}, expected a scalar loss tensor with a gradient")
        if not torch.isfinite(loss.detach()).all():
            raise RecipeCheckError(f"TrainingRecipe[{recipe.name}].{field}: loss on dataset[0:2] is {float(loss)}")
        loss.float().backward()

    def optimizer_step() -> None:
        with lrs.scaled_lrs(optimizer, 1.0):
            optimizer.step()

    _blame(recipe, field, forward_backward)
    _blame(recipe, "make_optimizer", optimizer_step)
    _blame(recipe, "make_scheduler", lambda: lrs.after_step(scheduler))
    if recipe.eval_dataset is not None:
        _check_evaluation(recipe, model, scheduler, device)


def check_entry_point(entrypoint: str, recipe: TrainingRecipe, device: torch.device | None = None, isolate: bool | None = None) -> None:
    """``check_recipe`` for ``recipe`` (loaded from ``entrypoint``) on the ranks' device.

    On a GPU (``isolate`` None) it runs in a spawned child process: a check in this process
    would leave a CUDA context — memory on the ranks' first GPU — for the whole run.
    """
    device = preflight_device() if device is None else device
    if not (device.type == "cuda" if isolate is None else isolate):
        check_recipe(recipe, device)
        return
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            pool.submit(_check_in_child, entrypoint, str(device)).result()
        except BrokenProcessPool:
            raise RecipeCheckError(f"entrypoint={entrypoint!r}: the pre-flight check's process died (on {device}); --no-preflight skips it") from None


def _check_in_child(entrypoint: str, device: str) -> None:
    check_recipe(load_entry_point(entrypoint), torch.device(device))


def check_picklable(recipe: TrainingRecipe) -> None:
    """With loader workers, the ranks' DataLoader pickles the dataset and the collate function:
    Dask workers start processes by spawn, so a lambda or a local function fails there, after
    the cluster started. Pickle them here the same way (multiprocessing's pickler)."""
    workers = recipe.loader.num_workers
    if not workers:
        return
    for field, value in (("dataset", recipe.dataset), ("collate_fn", recipe.collate_fn)):
        if value is None:
            continue
        try:
            ForkingPickler.dumps(value)
        except Exception as exc:  # noqa: BLE001 - pickling raises several types
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            raise RecipeCheckError(
                f"TrainingRecipe[{recipe.name}].{field}: cannot be pickled for the ranks' DataLoader worker processes "
                f"(loader.num_workers={workers}, started by spawn): {detail}; define it at module level "
                "(functools.partial for arguments) or set LoaderOptions(num_workers=0)"
            ) from None


def _check_evaluation(recipe: TrainingRecipe, model: torch.nn.Module, scheduler: object, device: torch.device) -> None:
    eval_dataset = recipe.eval_dataset
    sample = _blame(recipe, "eval_dataset[0]", lambda: eval_dataset[0])  # type: ignore[index]
    _check_pair(recipe, sample, "eval_dataset[0]")
    if recipe.eval_fn is None and recipe.eval_metrics is None:
        return
    head = dataclasses.replace(recipe, eval_dataset=Subset(eval_dataset, range(min(2, len(eval_dataset)))))  # type: ignore[arg-type]
    field = "eval_fn" if recipe.eval_fn is not None else "eval_metrics"
    try:
        result = _blame(recipe, field, lambda: evaluate(head, model, EvalLoader(head, device, 2)))
    except RecipeCheckError as exc:  # EvalMetricsError names its field already
        raise RecipeCheckError(str(exc).replace(f"{field}: EvalMetricsError: TrainingRecipe[{recipe.name}].{field}: ", f"{field}: ")) from None
    metrics = dict(result.metrics) | ({} if result.loss is None else {"loss": result.loss})
    try:
        lrs.after_evaluation(recipe, scheduler, metrics)
    except lrs.SchedulerMetricError as exc:  # names the field and what the evaluation returned
        raise RecipeCheckError(str(exc)) from None


def _shape(value: object) -> str:
    return f"of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
