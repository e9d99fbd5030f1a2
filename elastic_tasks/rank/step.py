"""What one optimizer step does besides forward/backward: LR, mixed precision, clipping.

* LR: ``rank/lr.py`` (each group's own LR times the system's factor, during the step only).
* bf16: autocast only. fp16: autocast and a ``GradScaler`` whose state is part of the
  elastic state (it travels on a rescale and in checkpoints).
* Clipping: on the allreduced (and, under fp16, unscaled) gradients, so every rank clips
  identically.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


FULL_PRECISION = contextlib.nullcontext()  # reusable and re-entrant: nothing made per micro-batch (the step enters none: ``is``)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The context a micro-batch's forward runs in: autocast for bf16/fp16, else one that does nothing."""
    dtype = _AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return FULL_PRECISION
    return torch.autocast(device.type, dtype=dtype)


def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
    (scaler.scale(loss) if scaler is not None else loss).backward()


def optimizer_step(optimizer: torch.optim.Optimizer, model: nn.Module, scaler: torch.amp.GradScaler | None, clip: float | None) -> None:
    if scaler is not None:
        if clip is not None:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(optimizer)  # skipped, identically on every rank, when the allreduced grads overflowed
        scaler.update()
        return
    if clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
