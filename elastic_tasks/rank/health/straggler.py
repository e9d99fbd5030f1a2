"""Persistent-straggler detection (seed 004, Algorithm 1).

Each step, every rank's throughput is divided by the median; an EWMA (alpha 0.1) of that
fraction smooths one-off hiccups, and a rank whose average falls below the threshold
(0.8: tolerate at most a 1.25x slowdown) is flagged. All ranks see the same throughput
vector (it rides on the step's statistics allreduce), so all flag the same ranks.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class StragglerDetector:
    alpha: float = 0.1
    threshold: float = 0.8
    ewma: dict[str, float] = field(default_factory=dict)
    flagged: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not (0 < self.alpha <= 1):
            raise ValueError(f"StragglerDetector.alpha={self.alpha!r}: must be in (0, 1]")
        if not (0 <= self.threshold <= 1):
            raise ValueError(f"StragglerDetector.threshold={self.threshold!r}: must be in [0, 1]")

    def update(self, throughput: Mapping[str, float]) -> list[str]:
        """Feed one step's samples/s per rank; returns ranks flagged for the first time."""
        valid = {k: v for k, v in throughput.items() if math.isfinite(v) and v > 0}
        if len(valid) < 2:
            return []  # nothing to compare against
        median = statistics.median(valid.values())
        newly = []
        for uid, value in valid.items():
            fraction = value / median
            self.ewma[uid] = self.alpha * fraction + (1 - self.alpha) * self.ewma.get(uid, 1.0)
            if self.ewma[uid] < self.threshold and uid not in self.flagged:
                self.flagged.add(uid)
                newly.append(uid)
        return newly

    @staticmethod
    def steps_to_flag(fraction: float, alpha: float = 0.1, threshold: float = 0.8) -> int:
        """Steps a rank running steadily at ``fraction`` of the median needs to be flagged (from 1.0)."""
        if fraction >= threshold:
            raise ValueError(f"fraction={fraction!r}: must be below threshold={threshold!r} to ever be flagged")
        # ewma_n = 1 - (1 - fraction) * (1 - (1 - alpha)^n) < threshold
        return math.ceil(math.log(1 - (1 - threshold) / (1 - fraction)) / math.log(1 - alpha) + 1e-12)
