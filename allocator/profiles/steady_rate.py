"""A configuration's steady samples/s from its timed intervals: the step-weighted median step time.

What a job "measured" at a configuration (``MeasuredTable``, each generation's
``measured_samples_per_s`` in the store) decides where it runs next (``allocator.profiles.measured``:
a configuration that measured below the best one on the same GPU count by more than the
tolerance is reverted). So it must be a property of the configuration, not of what happened
around it. A generation's timed intervals (rank 0's status reports, ~2 s apart, each holding
several steps) carry, besides the configuration's own step time:

* the cold steps after a regroup beyond the few skipped as warm-up (a new process group's
  first collectives, a fresh rank's first iterations and allocations): paid once per rescale,
  which ``RescaleCost`` already charges, not per step of the configuration;
* bursts of other work on the same cores (another job's ranks exiting, the service writing
  its records, other processes on a shared box). In issue 26's growth scenario on a loaded
  2-core box the 2 s intervals of one 2 x 256 generation ran at 0.25x to 2.6x of their median
  rate; two runs of the scenario measured the same configuration after growth at 1.29x and
  1.03x of its rate before, while each rank's CPU time per step was the same in both
  generations (0.131/0.138 s before, 0.128/0.132 s after: no slower steady state).

Total samples over total seconds (the mean) takes all of that in, in proportion to when it
happened to fall, so a short generation and a long one of the same configuration disagree
by more than the tolerance. The rule here: the step time half of the generation's timed
steps ran at or below — the median of per-step seconds with each interval weighing its step
count. Transients on fewer than half the steps do not move it; a configuration that is
slower at every step (a slower steady state) moves it fully. samples/s = global batch / that.
Periodic costs inside the loop (a checkpoint snapshot every 20 steps, an evaluation) fall
inside intervals of ~2 s and stay in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from allocator.checks import positive_int, require


@dataclass(frozen=True, slots=True)
class TimedInterval:
    """``steps`` consecutive steps of one configuration that took ``seconds`` together."""

    steps: int
    seconds: float

    def __post_init__(self) -> None:
        positive_int("TimedInterval", "steps", self.steps)
        s = self.seconds
        require(isinstance(s, (int, float)) and math.isfinite(s) and s > 0, "TimedInterval", "seconds", s, "must be finite and > 0")

    @property
    def per_step(self) -> float:
        return self.seconds / self.steps


def median_step_s(intervals: Sequence[TimedInterval]) -> float | None:
    """The smallest per-step time t such that intervals running at t or faster hold at least half
    of all the steps (None: no interval). The lower weighted median: one of the measured values,
    never an interpolation between them."""
    if not intervals:
        return None
    total = sum(i.steps for i in intervals)
    held = 0
    for i in sorted(intervals, key=lambda i: i.per_step):
        held += i.steps
        if 2 * held >= total:
            return i.per_step
    raise AssertionError("unreachable: the cumulative steps reach the total")


def steady_samples_per_s(global_batch: int, intervals: Sequence[TimedInterval]) -> float | None:
    """``global_batch`` over the median step time (None: no interval timed)."""
    t = median_step_s(intervals)
    return None if t is None else global_batch / t
