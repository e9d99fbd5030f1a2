"""``simulate``: the shared loop with a jumping clock and the modelled executor."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from allocator.loop import LoopResult, LoopSettings, StepReport, run_loop
from allocator.policies.base import Policy
from allocator.simulator.clock import SimClock
from allocator.simulator.executor import RescaleCost, SimExecutor
from allocator.types import JobSpec


def simulate(
    jobs: Iterable[JobSpec],
    policy: Policy,
    capacity: int,
    settings: LoopSettings = LoopSettings(),
    cost: RescaleCost = RescaleCost(),
    costs: Mapping[str, RescaleCost] | None = None,
    observer: Callable[[StepReport], None] | None = None,
) -> LoopResult:
    return run_loop(jobs, policy, capacity, SimClock(), SimExecutor(cost, costs), settings, observer)
