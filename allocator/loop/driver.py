"""``run_loop``: the one loop's driver — poll the source, reap, decide on ticks and events, sleep."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from allocator.loop.execution import Clock, Executor
from allocator.loop.run import LoopRun
from allocator.loop.types import LoopResult, LoopSettings, StepReport, JobTransition
from allocator.policies.base import Policy
from allocator.loop.sources import JobSource, StaticJobs
from allocator.types import JobSpec


def run_loop(
    jobs: Iterable[JobSpec] | JobSource,
    policy: Policy,
    capacity: int | Callable[[], int],
    clock: Clock,
    executor: Executor,
    settings: LoopSettings = LoopSettings(),
    observer: Callable[[StepReport], None] | None = None,
    on_job: Callable[[JobTransition], None] | None = None,
) -> LoopResult:
    """Run jobs to completion (or the horizon, or a stop from the source) under ``policy``.

    ``jobs`` is a fixed list (each arrives at its ``arrival_time``) or a live ``JobSource``.
    ``capacity`` is a GPU count, or a function giving the GPUs alive now: then a change is a
    reason to decide again, and a job larger than the cluster waits (workers may join) rather
    than being dropped at arrival. ``on_job`` hears every job's phase changes as they happen.
    """
    if hasattr(jobs, "poll"):
        source: JobSource = jobs  # type: ignore[assignment]
        specs: dict[str, JobSpec] = {}
    else:
        listed = list(jobs)
        specs = {j.id: j for j in listed}
        source = StaticJobs(listed)
    run = LoopRun(specs, policy, capacity, executor, settings, clock.now(), observer, on_job)
    while True:
        now = clock.now()
        update = source.poll(now)
        run.ingest(now, update)
        run.reap(now)
        if update.stop:
            break
        run.follow_capacity(now)
        on_tick = run.on_tick(now)
        if run.decision_due(now, on_tick):
            run.decide(now)
        if on_tick:
            run.advance_tick(now)
        wake = run.next_wake(now, source)
        if wake is None:
            break
        clock.sleep_until(wake)
    return run.result(clock.now())
