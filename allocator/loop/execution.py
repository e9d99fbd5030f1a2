"""What the loop needs from the world: a clock and an executor (simulated or real), and the
changes an executor must make between two allocations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from allocator.types import Allocation, JobSpec, MeasuredTable, RescaleEvent, Share, ThroughputProfile


@dataclass(frozen=True, slots=True)
class JobFailure:
    """A job the executor gave up on (every rank lost with no checkpoint, its entry point raised, ...)."""

    job_id: str
    reason: str


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep_until(self, t: float) -> None: ...


class Executor(Protocol):
    """Runs the loop's allocations (simulated or real); it may also be a ``NoiseReporter`` and a
    ``ProfileReporter``."""

    def apply(self, now: float, previous: Allocation, new: Allocation, jobs: Mapping[str, JobSpec]) -> list[RescaleEvent]:
        """Make the cluster run ``new``: start, grow, shrink or stop jobs; one event per changed job."""
        ...

    def progress(self, job_id: str, now: float) -> float:
        """Samples the job has processed by ``now`` (in the unit its ``total_samples`` counts)."""
        ...

    def completed(self, now: float) -> list[str]:
        """Jobs that finished all their samples by ``now``, each reported once."""
        ...

    def next_completion(self, now: float) -> float | None:
        """Earliest time a running job may finish, if known (exact when simulated)."""
        ...

    def failed(self, now: float) -> list[JobFailure]:
        """Jobs that failed by ``now``, each reported once; their GPUs are free again."""
        ...

    def in_effect(self, allocation: Allocation) -> Allocation:
        """``allocation`` as the cluster really runs it: a job that lost a worker runs on fewer GPUs."""
        ...


@runtime_checkable
class NoiseReporter(Protocol):
    """What an executor may add to ``Executor``: each running job's gradient noise scale as measured
    by the job itself. The loop copies it into ``RunningJob.noise_scale``, which a goodput policy
    prefers to its own model; an executor without the method reports nothing."""

    def noise_scale(self, job_id: str, now: float) -> float | None:
        """The job's latest measured B_noise (None: none yet; the policy keeps its model)."""
        ...


def reported_noise_scale(executor: Executor, job_id: str, now: float) -> float | None:
    return executor.noise_scale(job_id, now) if isinstance(executor, NoiseReporter) else None


@runtime_checkable
class ProfileReporter(Protocol):
    """What an executor may add to ``Executor``: each running job's throughput model refitted from
    the steps it has run (``allocator.profiles.refit``). The loop puts it into that job's spec in the
    snapshot, so every policy decides on what the job measured; an executor without the method
    (the simulators: their jobs run at their model by construction) reports nothing."""

    def profile(self, job_id: str, now: float) -> ThroughputProfile | None:
        """The job's refitted profile (None: nothing measured yet; the policy keeps the spec's)."""
        ...


def reported_profile(executor: Executor, job_id: str, now: float) -> ThroughputProfile | None:
    return executor.profile(job_id, now) if isinstance(executor, ProfileReporter) else None


@runtime_checkable
class MeasurementReporter(Protocol):
    """What an executor may add to ``Executor``: the samples/s each running job measured per
    configuration it ran (``allocator.profiles.measured``); the loop trusts them over the model. The
    simulators have none: their jobs run at their model by construction."""

    def measured(self, job_id: str, now: float) -> MeasuredTable | None:
        """The job's table (None: nothing measured yet)."""
        ...


def reported_measurements(executor: Executor, job_id: str, now: float) -> MeasuredTable | None:
    return executor.measured(job_id, now) if isinstance(executor, MeasurementReporter) else None


@runtime_checkable
class ChangeCostReporter(Protocol):
    """What an executor may add to ``Executor``: the seconds of progress a change of a running job's
    GPU count costs it. The loop copies it into ``RunningJob.change_cost_s``, so a policy that weighs
    the pause plans with the run's own cost whichever route built it (the simulators charge a known
    cost; an executor without the method reports nothing and the policy keeps its default)."""

    def change_cost(self, job_id: str) -> float | None:
        """Seconds a GPU-count change of ``job_id`` costs it now (None: not known)."""
        ...


def reported_change_cost(executor: Executor, job_id: str) -> float | None:
    return executor.change_cost(job_id) if isinstance(executor, ChangeCostReporter) else None


@runtime_checkable
class StartWaiter(Protocol):
    """What an executor may add to ``Executor``: jobs the loop admitted whose start waits for the
    resources the plan counted on (a real cluster frees a finishing job's workers a little after
    the plan). The job keeps its planned share; the loop decides again while any wait, and the
    executor tries each start again on every ``apply``. An executor without the method never waits."""

    def waiting_starts(self, now: float) -> tuple[str, ...]:
        """Jobs whose start is waiting now (empty: none)."""
        ...


def waiting_starts(executor: Executor, now: float) -> tuple[str, ...]:
    return executor.waiting_starts(now) if isinstance(executor, StartWaiter) else ()


@runtime_checkable
class Preempter(Protocol):
    """What an executor may add to ``Executor``: to be told, before the ``apply`` that stops it,
    that a job is preempted rather than ended (it goes back to the queue): a real one checkpoints
    it on the way out. An executor without the method stops it as any other (the simulators keep
    a stopped job's progress anyway)."""

    def preempt(self, job_id: str) -> None: ...


def share_changes(previous: Allocation, new: Allocation) -> list[tuple[str, Share | None, Share | None]]:
    """(job, before, after) for every job whose share differs — what an executor must do."""
    changes = []
    for job_id, share in new.shares:
        before = previous.get(job_id)
        if before != share:
            changes.append((job_id, before, share))
    for job_id, share in previous.shares:
        if job_id not in new:
            changes.append((job_id, share, None))
    return changes
