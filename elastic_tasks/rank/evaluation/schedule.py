"""When a running job evaluates: every N steps and/or every S seconds, decided alike on every rank.

Sharded evaluation is a collective and a metric-driven scheduler must step on every rank, so
all ranks must evaluate at the same step boundary. By steps that is arithmetic on the step
count they share. By seconds each rank's clock would differ by a step now and then, so rank
0's clock travels in the step's agreement (``agreement.StepOutcome.eval_clock``): every rank
reads the same value at the same boundary, one step after it was taken, and decides alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class EvalSchedule:
    every_steps: int | None
    every_s: float | None
    last_step: int = 0  # steps done when the job last evaluated (or the schedule started)
    _last_time: float = field(default_factory=time.monotonic)

    @property
    def periodic(self) -> bool:
        return self.every_steps is not None or self.every_s is not None

    def clock(self) -> float:
        """Seconds since the last evaluation (what rank 0 puts in its step's agreement)."""
        return time.monotonic() - self._last_time

    def due(self, steps_done: int, agreed_step: int | None = None, agreed_clock: float = 0.0) -> bool:
        """Evaluate now, with ``steps_done`` steps taken? ``agreed_step`` is the (0-based) step
        whose agreement was just read and ``agreed_clock`` rank 0's clock in it."""
        if not self.periodic or steps_done <= self.last_step:
            return False
        if self.every_steps is not None and steps_done % self.every_steps == 0:
            return True
        # An agreement issued before the last evaluation carries a clock that evaluation reset.
        fresh = agreed_step is not None and agreed_step >= self.last_step
        return self.every_s is not None and fresh and agreed_clock >= self.every_s

    def evaluated(self, steps_done: int) -> None:
        self.last_step = steps_done
        self._last_time = time.monotonic()
