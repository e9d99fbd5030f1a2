"""One HPO trial's stage as an elastic job: the base recipe with the trial's learning rate,
resumed from the trial's previous stage.

RubberBand resizes a trial between stages by checkpointing it, destroying its workers and
restoring the checkpoint on new ones. Here each stage of a trial is one elastic job (any
world size); its recipe restores model and optimizer from the checkpoint the previous stage's
job wrote when it finished. Workers build recipes from an entry-point string, so the trial's
settings travel inside the attribute name::

    elastic_tasks.hpo_trial:trial_<urlsafe base64 of JSON>

and this module's ``__getattr__`` (PEP 562) decodes it. Nothing is kept in module state.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from elastic_tasks.recipe import TrainingRecipe, load_entry_point, optimizer_argument
from elastic_tasks.rank.state.elastic import CHECKPOINT_NAME, has_checkpoint, read_checkpoint

_PREFIX = "trial_"


@dataclass(frozen=True, slots=True)
class TrialRecipeSpec:
    """``base``: the user's entry point; ``lr``: the trial's LR at ``batch`` (None: the recipe's,
    scaled linearly to ``batch``); ``resume_from``: the previous stage's checkpoint directory."""

    base: str
    batch: int
    lr: float | None = None
    resume_from: str | None = None

    def __post_init__(self) -> None:
        if ":" not in self.base:
            raise ValueError(f"TrialRecipeSpec.base={self.base!r}: expected 'package.module:function'")
        if not (isinstance(self.batch, int) and self.batch > 0):
            raise ValueError(f"TrialRecipeSpec.batch={self.batch!r}: must be a positive integer")
        if self.lr is not None and not (self.lr > 0):
            raise ValueError(f"TrialRecipeSpec.lr={self.lr!r}: must be > 0")


def trial_entrypoint(spec: TrialRecipeSpec) -> str:
    payload = json.dumps(dataclasses.asdict(spec), sort_keys=True).encode()
    return f"{__name__}:{_PREFIX}{base64.b32encode(payload).decode().rstrip('=').lower()}"


def decode(name: str) -> TrialRecipeSpec:
    if not name.startswith(_PREFIX):
        raise AttributeError(name)
    text = name[len(_PREFIX) :].upper()
    try:
        data = json.loads(base64.b32decode(text + "=" * (-len(text) % 8)))
    except (ValueError, json.JSONDecodeError) as exc:
        raise AttributeError(f"{name[:40]}...: not an encoded trial ({exc})") from None
    return TrialRecipeSpec(**data)


def __getattr__(name: str) -> Callable[[], TrainingRecipe]:
    spec = decode(name)
    return partial(trial_recipe, spec)


def trial_recipe(spec: TrialRecipeSpec) -> TrainingRecipe:
    base = load_entry_point(spec.base)
    lr = spec.lr if spec.lr is not None else base.base_lr * spec.batch / base.base_batch
    return dataclasses.replace(
        base,
        name=f"{base.name}-trial",
        build_model=partial(_restored_model, base.build_model, spec.resume_from),
        make_optimizer=partial(_restored_optimizer, base.make_optimizer, spec.resume_from),
        # base_batch = the trial's batch, so the trainer's linear scaling leaves the LR as given.
        base_lr=lr,
        base_batch=spec.batch,
    )


def _checkpoint(directory: str) -> dict:
    # A path or an fsspec URL: the service writes checkpoints wherever its root says.
    if not has_checkpoint(directory):
        raise FileNotFoundError(f"resume_from={directory!r}: no {CHECKPOINT_NAME} there (previous stage did not finish?)")
    return read_checkpoint(directory)


def _restored_model(build: Callable[[], nn.Module], resume_from: str | None) -> nn.Module:
    model = build()
    if resume_from is not None:
        model.load_state_dict(_checkpoint(resume_from)["model"])
    return model


def _restored_optimizer(make: Callable[..., torch.optim.Optimizer], resume_from: str | None, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """The base recipe's optimizer (given what its own signature asks for), with the previous stage's state."""
    optimizer = make(optimizer_argument(make, model), lr)
    if resume_from is not None:
        # Momentum buffers carry over, as RubberBand's checkpoints do; the LRs are the trial's.
        own = [group["lr"] for group in optimizer.param_groups]
        optimizer.load_state_dict(_checkpoint(resume_from)["optimizer"])
        for group, group_lr in zip(optimizer.param_groups, own, strict=True):
            group["lr"] = group_lr
    return optimizer

