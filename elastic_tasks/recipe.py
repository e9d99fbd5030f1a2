"""What a user brings to train elastically: a recipe, returned by an entry point.

An entry point is ``package.module:function``; calling the function (no arguments) returns
a ``TrainingRecipe``. The system owns sharding, batch size, learning rate and world size;
the recipe says only what to train and how to build the optimizer for a given LR.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset


@dataclass(frozen=True)
class TrainingRecipe:
    """A model to train and the data and rules to train it with.

    ``base_lr`` is the learning rate that suits ``base_batch``; hybrid scaling moves the LR
    from there as the global batch changes. ``dataset`` must be map-style and
    deterministic (index -> same sample on every process), because ranks shard it by index.
    """

    name: str
    build_model: Callable[[], nn.Module]
    dataset: Dataset
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    make_optimizer: Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer]
    base_lr: float
    base_batch: int
    eval_dataset: Dataset | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError(f"TrainingRecipe.name={self.name!r}: must be a non-empty string")
        if not (self.base_lr > 0):
            raise ValueError(f"TrainingRecipe[{self.name}].base_lr={self.base_lr!r}: must be > 0")
        if not (isinstance(self.base_batch, int) and self.base_batch > 0):
            raise ValueError(f"TrainingRecipe[{self.name}].base_batch={self.base_batch!r}: must be a positive integer")
        if len(self.dataset) == 0:  # type: ignore[arg-type]
            raise ValueError(f"TrainingRecipe[{self.name}].dataset: is empty")


def collate(dataset: Dataset, indices: Iterable[int], device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Read ``indices`` from ``dataset`` and stack inputs and labels (on ``device``).

    The one way a batch is built: the trainer's ranks and the profiler call it, so a profile
    that times collation times exactly what a rank does.
    """
    samples = [dataset[int(i)] for i in indices]
    x = torch.stack([s[0] for s in samples])
    y = torch.stack([torch.as_tensor(s[1]) for s in samples])
    if device is not None:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return x, y


class EntryPointError(ValueError):
    """An entry point that cannot give a recipe: one line naming it, and what went wrong.

    Whatever the user's code raised (a syntax error, an error at import or in the function,
    a function that needs arguments) is the ``__cause__``, for callers that show tracebacks.
    """


def load_entry_point(spec: str) -> TrainingRecipe:
    """Import ``package.module:function`` and call it; every failure names the entry point."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise EntryPointError(f"entrypoint={spec!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
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
