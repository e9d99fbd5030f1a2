"""What a user brings to train elastically: a recipe, returned by an entry point.

An entry point is ``package.module:function`` (``elastic_tasks.workloads.resolve_workload``
also takes a built-in example's name); calling the function (no arguments) returns
a ``TrainingRecipe``. The system owns sharding, batch size, learning rate scaling and world
size; the recipe says what to train and how: the optimizer (with the user's own parameter
groups), and optionally a step hook for any batch structure, a collate function, DataLoader
options, mixed precision, gradient clipping, a ``torch.optim.lr_scheduler`` (or an LR factor
by samples seen), and periodic evaluation with the user's own metrics.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from elastic_tasks.code_version import refresh

PRECISIONS = ("fp32", "bf16", "fp16")

# ``make_optimizer``'s first parameter name says what it is given (``optimizer_input``).
MODEL_NAMES = ("model", "module")
NAMED_PARAMETER_NAMES = ("named_parameters", "named_params")


@dataclass(frozen=True, slots=True)
class LoaderOptions:
    """How each rank's DataLoader reads: worker processes, pinned memory, batches prefetched per worker."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.num_workers, int) and self.num_workers >= 0):
            raise ValueError(f"LoaderOptions.num_workers={self.num_workers!r}: must be an integer >= 0")
        if self.prefetch_factor is not None:
            if not (isinstance(self.prefetch_factor, int) and self.prefetch_factor >= 1):
                raise ValueError(f"LoaderOptions.prefetch_factor={self.prefetch_factor!r}: must be an integer >= 1")
            if self.num_workers == 0:
                raise ValueError(f"LoaderOptions.prefetch_factor={self.prefetch_factor!r}: needs num_workers >= 1")


@dataclass(frozen=True)
class TrainingRecipe:
    """A model to train and the data and rules to train it with.

    ``base_lr`` is the learning rate that suits ``base_batch``; hybrid scaling multiplies every
    parameter group's *own* LR by the batch factor as the global batch changes, so per-group
    ratios hold. ``dataset`` must be map-style and deterministic (index -> same sample on
    every process), because ranks shard it by index.

    ``make_optimizer(x, lr)``: what ``x`` is depends on the name of its first parameter —
    ``model`` (or ``module``): the model itself; ``named_parameters`` (or ``named_params``):
    a list of ``(name, parameter)`` pairs, so groups are built by name as in a plain loop;
    any other name (the original contract, e.g. ``params``): ``model.parameters()``. ``lr`` is
    ``base_lr``; groups may set their own.

    What a step computes: ``loss_fn(model(x), y)`` on ``(x, y)`` batches, or
    ``step_fn(model, batch) -> mean loss`` for any batch structure that ``collate_fn``
    (default: torch's ``default_collate``) builds; with ``step_fn`` no ``loss_fn`` is needed.
    ``model`` is always the module ``build_model`` returned (on the rank's device) — in the
    pre-flight check, in training and in evaluation. In training the whole step runs inside
    DDP's forward (as Lightning runs ``training_step``), so methods of the model may be called
    and gradients are still averaged across ranks.

    Schedules: ``make_scheduler(optimizer)`` returns any ``torch.optim.lr_scheduler`` (OneCycleLR
    with its momentum cycling included); it steps once per optimizer step, and its state
    travels with the elastic state. A ``ReduceLROnPlateau`` steps after each evaluation
    instead, on the metric ``scheduler_metric``. ``lr_schedule(samples_seen) -> factor`` (the
    older form) multiplies the LR by progress in samples.

    Evaluation: ``eval_fn(model, loader) -> {name: number}`` over ``eval_dataset``, every
    ``eval_every`` steps and/or ``eval_every_s`` seconds and once at the end; ``loader`` yields
    batches on the model's device at the job's per-GPU batch cap. With ``eval_sharded`` each
    rank reads its slice of the eval set and ``loader.gather(tensor)`` concatenates a
    per-sample tensor across ranks in dataset order, so metrics over the whole set
    (macro-F1, AUC) are exact; on rank 0 alone ``gather`` returns its argument. A ``loss`` key,
    when returned, is the eval loss. Without ``eval_fn`` the training objective (and the older
    per-batch ``eval_metrics(model, batch)``, sample-weighted) is evaluated.
    """

    name: str
    build_model: Callable[[], nn.Module]
    dataset: Dataset
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # Required; defaults only so that ``loss_fn`` may be left out while positional recipes keep working.
    make_optimizer: Callable[[Any, float], torch.optim.Optimizer] | None = None
    base_lr: float | None = None
    base_batch: int | None = None
    eval_dataset: Dataset | None = None
    step_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    loader: LoaderOptions = field(default_factory=LoaderOptions)
    precision: str = "fp32"
    clip_grad_norm: float | None = None
    lr_schedule: Callable[[int], float] | None = None
    eval_metrics: Callable[[nn.Module, Any], Mapping[str, float]] | None = None
    make_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None
    scheduler_metric: str = "loss"
    eval_fn: Callable[[nn.Module, Any], Mapping[str, float]] | None = None
    eval_every: int | None = None
    eval_every_s: float | None = None
    eval_sharded: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError(f"TrainingRecipe.name={self.name!r}: must be a non-empty string")
        if not callable(self.make_optimizer):
            raise ValueError(f"TrainingRecipe[{self.name}].make_optimizer={self.make_optimizer!r}: required, a function (params, lr) -> optimizer")
        if not (isinstance(self.base_lr, (int, float)) and self.base_lr > 0):
            raise ValueError(f"TrainingRecipe[{self.name}].base_lr={self.base_lr!r}: must be > 0")
        if not (isinstance(self.base_batch, int) and self.base_batch > 0):
            raise ValueError(f"TrainingRecipe[{self.name}].base_batch={self.base_batch!r}: must be a positive integer")
        if len(self.dataset) == 0:  # type: ignore[arg-type]
            raise ValueError(f"TrainingRecipe[{self.name}].dataset: is empty")
        if self.loss_fn is None and self.step_fn is None:
            raise ValueError(f"TrainingRecipe[{self.name}].loss_fn=None: give loss_fn or step_fn")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainingRecipe[{self.name}].precision={self.precision!r}: expected one of {', '.join(PRECISIONS)}")
        if self.clip_grad_norm is not None and not (math.isfinite(self.clip_grad_norm) and self.clip_grad_norm > 0):
            raise ValueError(f"TrainingRecipe[{self.name}].clip_grad_norm={self.clip_grad_norm!r}: must be a finite number > 0")
        if not isinstance(self.loader, LoaderOptions):
            raise ValueError(f"TrainingRecipe[{self.name}].loader={self.loader!r}: expected LoaderOptions")
        self._check_evaluation()

    def _check_evaluation(self) -> None:
        every = self.eval_every
        if every is not None and not (isinstance(every, int) and not isinstance(every, bool) and every >= 1):
            raise ValueError(f"TrainingRecipe[{self.name}].eval_every={every!r}: must be a number of steps >= 1")
        seconds = self.eval_every_s
        if seconds is not None and not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"TrainingRecipe[{self.name}].eval_every_s={seconds!r}: must be a number of seconds > 0")
        periodic = every is not None or seconds is not None
        if (periodic or self.eval_fn is not None) and self.eval_dataset is None:
            field_name = "eval_fn" if self.eval_fn is not None else ("eval_every" if every is not None else "eval_every_s")
            raise ValueError(f"TrainingRecipe[{self.name}].{field_name}: needs eval_dataset")
        if self.eval_sharded and self.eval_fn is None:
            raise ValueError(f"TrainingRecipe[{self.name}].eval_sharded=True: needs eval_fn (it gathers what it needs with loader.gather)")

    def collate(self, samples: list[Any]) -> Any:
        return (self.collate_fn or default_collate)(samples)

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Mean loss of ``batch`` and, for ``(x, y)`` classification batches, the outputs' correct count."""
        if self.step_fn is not None:
            return self.step_fn(model, batch), None
        x, y = batch
        out = model(x)
        loss = self.loss_fn(out, y)  # type: ignore[misc]
        # argmax has no gradient: no autograd node to avoid, so no detach (one op less every micro-batch).
        correct = (out.argmax(dim=1) == y).sum() if out.dim() == 2 and y.dim() == 1 else None
        return loss, correct


def optimizer_input(make_optimizer: Callable[..., Any]) -> str:
    """What ``make_optimizer`` is given, read from its first parameter's name: ``"model"``,
    ``"named_parameters"`` or ``"parameters"`` (the original contract, and any signature that
    cannot be read, e.g. a C-implemented callable)."""
    try:
        params = [p for p in inspect.signature(make_optimizer).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return "parameters"
    first = params[0].name if params else ""
    if first in MODEL_NAMES:
        return "model"
    if first in NAMED_PARAMETER_NAMES:
        return "named_parameters"
    return "parameters"


def optimizer_argument(make_optimizer: Callable[..., Any], model: nn.Module) -> Any:
    """What ``make_optimizer`` is called with for ``model``: the model, its named parameters or its parameters."""
    given = optimizer_input(make_optimizer)
    if given == "model":
        return model
    return list(model.named_parameters()) if given == "named_parameters" else model.parameters()


def build_optimizer(recipe: TrainingRecipe, model: nn.Module, lr: float | None = None) -> torch.optim.Optimizer:
    """``recipe.make_optimizer`` called with what its signature asks for (``optimizer_input``)."""
    make = recipe.make_optimizer
    assert make is not None  # checked when the recipe was built
    return make(optimizer_argument(make, model), recipe.base_lr if lr is None else lr)


def collate_function(recipe: TrainingRecipe) -> Callable[[list[Any]], Any]:
    """The collate function a DataLoader gets: the recipe's own (or torch's), never a bound
    method of the recipe — DataLoader workers on Dask are spawn-started, so whatever the loader
    holds is pickled, and a bound method would drag every field of the recipe along."""
    return recipe.collate_fn or default_collate


def collate(dataset: Dataset, indices: Iterable[int], device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Read ``indices`` from ``dataset`` and stack inputs and labels (on ``device``).

    The ``(x, y)`` contract's batch, as the profiler and benchmarks build it.
    """
    samples = [dataset[int(i)] for i in indices]
    x = torch.stack([s[0] for s in samples])
    y = torch.stack([torch.as_tensor(s[1]) for s in samples])
    if device is not None:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return x, y


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a nested dict/list/tuple batch to ``device``; other leaves stay."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


class EntryPointError(ValueError):
    """An entry point that cannot give a recipe: one line naming it, and what went wrong.

    Whatever the user's code raised (a syntax error, an error at import or in the function,
    a function that needs arguments) is the ``__cause__``, for callers that show tracebacks.
    """


def load_entry_point(spec: str) -> TrainingRecipe:
    """Import ``package.module:function`` and call it; every failure names the entry point.

    Like ``python -m``, a module in the current directory is found without ``PYTHONPATH``
    (Dask workers started here share the directory, so they find it the same way).
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise EntryPointError(f"entrypoint={spec!r}: expected 'package.module:function'")
    try:
        # Fresh: a long-lived worker runs the module as it is on disk now, not as first imported.
        module = refresh(_import_from_path_or_cwd(module_name))
    except ImportError as exc:
        raise EntryPointError(f"entrypoint={spec!r}: cannot import module {module_name!r} ({exc})") from exc
    except Exception as exc:  # the user's module failed while importing: SyntaxError, anything at top level
        raise EntryPointError(f"entrypoint={spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise EntryPointError(f"entrypoint={spec!r}: module {module_name!r} has no callable {attr!r}")
    try:
        recipe = fn()
    except Exception as exc:  # the user's function (or the recipe it built) failed
        raise EntryPointError(f"entrypoint={spec!r}: calling it raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(recipe, TrainingRecipe):
        raise EntryPointError(f"entrypoint={spec!r}: returned {type(recipe).__name__}, expected TrainingRecipe")
    return recipe


def _import_from_path_or_cwd(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.partition(".")[0]
        cwd = os.getcwd()
        # Only a missing *top-level* module falls back to the cwd; an import error inside it is the user's.
        if exc.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(module_name)
