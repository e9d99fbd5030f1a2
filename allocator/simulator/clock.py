"""Simulated time: ``sleep_until`` jumps, so a day of cluster time costs nothing."""

from __future__ import annotations


class SimClock:
    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def sleep_until(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"sleep_until(t={t!r}): earlier than now={self._now!r}; simulated time never runs backwards")
        self._now = float(t)
