"""How to profile (``ProfileSettings``) and how profiling fails (``ProfilerError``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


class ProfilerError(RuntimeError):
    """A measurement could not be taken (a worker failed or hung, nothing fits in memory)."""


def positive_ints(owner: str, name: str, values: Sequence[int], minimum: int = 1) -> tuple[int, ...]:
    out = tuple(values)
    if not out:
        raise ValueError(f"{owner}.{name}={out!r}: must not be empty")
    for v in out:
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= minimum):
            raise ValueError(f"{owner}.{name}={out!r}: every value must be an integer >= {minimum}")
    if len(set(out)) != len(out):
        raise ValueError(f"{owner}.{name}={out!r}: values must be distinct")
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """How to profile.

    ``max_batch_per_gpu``: the memory cap. On CPU it is this setting (default: the largest
    ladder batch); on CUDA ``None`` means probe it (up to ``probe_limit``), a number means trust it.
    ``allreduce_gpus``: worker counts to time allreduce on (1 is allowed and skipped: no
    communication). ``allreduce_params``: parameter counts to time (default: an eighth, a
    half and all of the model's trainable parameters). ``threads``: torch intra-op threads
    while measuring (default: leave the process's setting); part of the hardware fingerprint.
    ``include_data``: collate every timed iteration's batch from the data set inside the timed
    region, as the elastic trainer's ranks do — with in-memory or synthetic data that work is on
    the critical path, and a profile without it under-predicts a real step (measured: about
    half of a ``resnet_small`` step on CPU, 48 of 91 ms at batch 128). False gives seed 000's
    pure processing time, right where a loader overlaps it.
    """

    batch_sizes: tuple[int, ...] = (8, 16, 32, 64)
    warmup: int = 2
    repeats: int = 5
    max_batch_per_gpu: int | None = None
    probe_limit: int = 4096
    allreduce_gpus: tuple[int, ...] = (2,)
    allreduce_params: tuple[int, ...] | None = None
    allreduce_repeats: int = 5
    timeout_s: float = 120.0
    device: str = "cpu"
    threads: int | None = None
    include_data: bool = True

    def __post_init__(self) -> None:
        owner = "ProfileSettings"
        object.__setattr__(self, "batch_sizes", positive_ints(owner, "batch_sizes", self.batch_sizes))
        object.__setattr__(self, "allreduce_gpus", positive_ints(owner, "allreduce_gpus", self.allreduce_gpus))
        if self.allreduce_params is not None:
            object.__setattr__(self, "allreduce_params", positive_ints(owner, "allreduce_params", self.allreduce_params))
        for name in ("warmup",):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 0):
                raise ValueError(f"{owner}.{name}={v!r}: must be an integer >= 0")
        for name in ("repeats", "allreduce_repeats", "probe_limit"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"{owner}.{name}={v!r}: must be a positive integer")
        if self.max_batch_per_gpu is not None and not (
            isinstance(self.max_batch_per_gpu, int) and self.max_batch_per_gpu > 0
        ):
            raise ValueError(f"{owner}.max_batch_per_gpu={self.max_batch_per_gpu!r}: must be a positive integer")
        if not isinstance(self.include_data, bool):
            raise ValueError(f"{owner}.include_data={self.include_data!r}: must be true or false")
        if self.threads is not None and not (isinstance(self.threads, int) and not isinstance(self.threads, bool) and self.threads > 0):
            raise ValueError(f"{owner}.threads={self.threads!r}: must be a positive integer")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"{owner}.timeout_s={self.timeout_s!r}: must be a finite number > 0")
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"{owner}.device={self.device!r}: not a torch device") from None
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"{owner}.device={self.device!r}: expected cpu or cuda")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{owner}.device={self.device!r}: CUDA is not available on this machine")

    @property
    def is_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    @property
    def backend(self) -> str:
        return "nccl" if self.is_cuda else "gloo"
