"""``simulate``: the shared loop with a jumping clock and a modelled executor, on one physics per run.

A run's physics follows its jobs (``allocator.physics.choice``): goodput (``GoodputSimExecutor``) when
any job carries a gradient noise scale, else throughput (``SimExecutor``). Every policy compared
on the same jobs is judged on the same physics, and a policy that models noise differently from
the jobs' own is refused (``check_physics``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from allocator.loop import LoopResult, LoopSettings, StepReport, run_loop
from allocator.physics.choice import Physics, check_physics, physics_of
from allocator.policies.base import Policy
from allocator.simulator.clock import SimClock
from allocator.simulator.executor import RescaleCost, SimExecutor
from allocator.simulator.goodput_executor import GoodputSimExecutor
from allocator.types import JobSpec

__all__ = ["Physics", "check_physics", "physics_of", "simulate"]


def simulate(
    jobs: Iterable[JobSpec],
    policy: Policy,
    capacity: int,
    settings: LoopSettings = LoopSettings(),
    cost: RescaleCost = RescaleCost(),
    costs: Mapping[str, RescaleCost] | None = None,
    observer: Callable[[StepReport], None] | None = None,
    gpus_per_host: int | None = None,
    report_noise: bool = True,
) -> LoopResult:
    """Run ``jobs`` under ``policy`` on the physics their noise scales call for (``physics_of``).

    ``costs`` (per-job rescale costs) and ``gpus_per_host`` (allreduce across hosts) are
    honoured by the physics that models them: per-job costs by throughput physics, hosts by
    goodput physics; asking the other for them is an error. ``report_noise``: on goodput
    physics each running job reports its B_noise as its trainer would measure it (the policy
    prefers it to its own model); off, the policy reads its model at the job's *declared*
    progress (the same values unless a job's declared work is off: ``JobSpec.actual_samples``).
    """
    listed = list(jobs)
    check_physics(policy, listed, gpus_per_host)
    if physics_of(listed) is Physics.GOODPUT:
        if costs:
            raise ValueError(f"costs={sorted(costs)!r}: per-job rescale costs are modelled by throughput physics only; these jobs carry noise scales")
        executor: SimExecutor | GoodputSimExecutor = GoodputSimExecutor({}, cost, gpus_per_host, report_noise=report_noise)
    else:
        if gpus_per_host is not None:
            raise ValueError(f"gpus_per_host={gpus_per_host!r}: hosts are modelled by goodput physics only; no job carries a noise scale")
        executor = SimExecutor(cost, costs)
    return run_loop(listed, policy, capacity, SimClock(), executor, settings, observer)
