"""A small transformer language model on text every machine has: the standard library's source.

``elastic_tasks.examples:tiny_lm`` reads the ``*.py`` files at the top of
``sysconfig.get_paths()["stdlib"]`` (sorted, up to ``max_bytes``) when the recipe is built —
no download — and tokenises them at the byte level (vocabulary 256). Samples are
non-overlapping windows as dicts ``{"input_ids", "labels"}`` (labels shifted by one), so the
recipe uses the wider contract: a step hook, AdamW, a cosine schedule with warm-up over
samples seen, gradient clipping, and bits per byte as an eval metric. No dropout: the
elastic loss curve must equal a fixed-size run's.

The text depends on the Python build, so figures differ between machines; within one
machine every process reads the same bytes.
"""

from __future__ import annotations

import math
import sysconfig
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from elastic_tasks.recipe import TrainingRecipe

VOCAB = 256


def stdlib_bytes(max_bytes: int) -> bytes:
    """The first ``max_bytes`` of the standard library's top-level modules, in name order."""
    if not (isinstance(max_bytes, int) and max_bytes > 0):
        raise ValueError(f"max_bytes={max_bytes!r}: must be a positive integer")
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for path in sorted(root.glob("*.py")):
        out += path.read_bytes()
        if len(out) >= max_bytes:
            break
    if not out:
        raise ValueError(f"stdlib={str(root)!r}: no *.py files to read")
    return bytes(out[:max_bytes])


class ByteWindows(Dataset):
    """Window ``i`` of ``context`` bytes as ``{"input_ids", "labels"}``; windows ``[first, first + count)``."""

    def __init__(self, data: Tensor, context: int, first: int = 0, count: int | None = None) -> None:
        total = (len(data) - 1) // context
        count = total - first if count is None else count
        if not (context >= 1 and 0 <= first and count >= 1 and first + count <= total):
            raise ValueError(f"ByteWindows(first={first!r}, count={count!r}): the text holds {total} windows of {context} bytes")
        self.data, self.context, self.first, self.count = data, context, first, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        if not (0 <= index < self.count):
            raise IndexError(f"index {index} out of range for {self.count} windows")
        start = (self.first + int(index)) * self.context
        chunk = self.data[start : start + self.context + 1].long()
        return {"input_ids": chunk[:-1], "labels": chunk[1:]}


class TinyLM(nn.Module):
    """Pre-norm causal transformer: byte embeddings + learned positions, ``layers`` blocks, tied-free head."""

    def __init__(self, context: int = 64, width: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, ids: Tensor) -> Tensor:
        t = ids.shape[1]
        h = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))


def lm_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten())


def bits_per_byte(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, float]:
    return {"bits_per_byte": float(lm_loss(model, batch)) / math.log(2)}


def cosine_with_warmup(samples_seen: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """LR factor by progress in samples: linear warm-up, then cosine down to ``floor``."""
    if samples_seen < warmup:
        return (samples_seen + 1) / warmup
    progress = min(1.0, (samples_seen - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def adamw(params, lr: float) -> torch.optim.Optimizer:  # noqa: ANN001
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)


def tiny_lm(*, context: int = 64, max_bytes: int = 400_000, eval_windows: int = 256, precision: str = "fp32", total_samples: int = 32_000) -> TrainingRecipe:
    """Byte-level LM on stdlib source; ~110k parameters at the defaults (seconds per 20 steps on a CPU)."""
    data = torch.frombuffer(bytearray(stdlib_bytes(max_bytes)), dtype=torch.uint8)
    windows = (len(data) - 1) // context
    train = ByteWindows(data, context, 0, windows - eval_windows)
    return TrainingRecipe(
        name="tiny_lm",
        build_model=partial(TinyLM, context=context),
        dataset=train,
        loss_fn=None,
        make_optimizer=adamw,
        base_lr=3e-3,
        base_batch=32,
        eval_dataset=ByteWindows(data, context, windows - eval_windows, eval_windows),
        step_fn=lm_loss,
        precision=precision,
        clip_grad_norm=1.0,
        lr_schedule=partial(cosine_with_warmup, warmup=320, total=total_samples),
        eval_metrics=bits_per_byte,
    )
