"""What a job measured per configuration (GPUs, global batch, accumulation steps): the data a
policy's answer is adapted with (``allocator.profiles.measured``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from allocator.checks import positive_int, require


@dataclass(frozen=True, slots=True)
class MeasuredRate:
    """One configuration a job ran: ``steps`` steps at ``samples_per_s`` (their total samples over total seconds)."""

    gpus: int
    batch: int
    accum_steps: int
    samples_per_s: float
    steps: int

    def __post_init__(self) -> None:
        for name in ("gpus", "batch", "accum_steps", "steps"):
            positive_int("MeasuredRate", name, getattr(self, name))
        v = self.samples_per_s
        require(isinstance(v, (int, float)) and math.isfinite(v) and v > 0, "MeasuredRate", "samples_per_s", v, "must be finite and > 0")

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.gpus, self.batch, self.accum_steps)


@dataclass(frozen=True, slots=True)
class MeasuredTable:
    """A job's measured configurations, one entry each."""

    rates: tuple[MeasuredRate, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "rates", tuple(self.rates))
        keys = [r.key for r in self.rates]
        require(len(set(keys)) == len(keys), "MeasuredTable", "rates", keys, "has a configuration twice")

    def rate(self, gpus: int, batch: int, accum_steps: int) -> MeasuredRate | None:
        for r in self.rates:
            if r.key == (gpus, batch, accum_steps):
                return r
        return None

    def at(self, gpus: int) -> tuple[MeasuredRate, ...]:
        return tuple(r for r in self.rates if r.gpus == gpus)
