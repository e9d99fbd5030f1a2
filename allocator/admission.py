"""Seed 000's autoscaler step as a pure function of a snapshot.

An arriving (queued) job is admitted only if every running job plus it can still get its
minimum GPUs under the policy. What does not fit is dropped or stays queued, a setting.
``reallocate`` is the interval-Δ step: admit, then ask the policy for the new allocation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol, runtime_checkable

from allocator.policies.base import Policy, SupportsMinGpus
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, RunningJob


class OverflowMode(str, Enum):
    """What happens to a job that does not fit now."""

    DROP = "drop"
    QUEUE = "queue"


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    admitted: tuple[JobSpec, ...]
    queued: tuple[JobSpec, ...]
    dropped: tuple[JobSpec, ...]


@runtime_checkable
class SupportsAdmission(Protocol):
    """A policy with its own admission rule (queue discipline, start condition), e.g. Elan's E-BF."""

    def admit(self, snapshot: ClusterSnapshot, mode: OverflowMode) -> AdmissionDecision: ...


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one re-allocation: who runs with what, who waits, who was turned away."""

    allocation: Allocation
    admission: AdmissionDecision


def _fits(policy: Policy, snapshot: ClusterSnapshot, jobs: list[JobSpec]) -> bool:
    """Seed 000's test by trial solve: can every job in ``jobs`` get its minimum at once?"""
    trial = replace(snapshot, queued=tuple(j for j in jobs if snapshot.current_share(j.id) is None))
    try:
        policy.allocate(trial)
    except InfeasibleError:
        return False
    return True


def admit(snapshot: ClusterSnapshot, policy: Policy, mode: OverflowMode, strict_fifo: bool = True) -> AdmissionDecision:
    """Add queued jobs one by one, in arrival order, while everyone still fits (seed 000, Fig. 4).

    With ``strict_fifo`` the first job that does not fit blocks the ones behind it (a FIFO
    queue); without it later, smaller jobs may pass. In DROP mode a job that does not fit
    is rejected now and never retried. A policy with its own rule (``SupportsAdmission``)
    decides for itself.
    """
    if isinstance(policy, SupportsAdmission):
        return policy.admit(snapshot, mode)
    accepted = [r.spec for r in snapshot.running]
    admitted: list[JobSpec] = []
    waiting: list[JobSpec] = []
    dropped: list[JobSpec] = []
    blocked = False
    # With a min_gpus shortcut, "everyone fits" is a running sum of minimum GPU counts.
    cheap = isinstance(policy, SupportsMinGpus)
    needed = 0
    if cheap:
        needs = [policy.min_gpus(j, snapshot.capacity) for j in accepted]
        needed = snapshot.capacity + 1 if None in needs else sum(needs)  # type: ignore[arg-type]
    for job in snapshot.queued:
        fits = False
        if not blocked:
            if cheap:
                need = policy.min_gpus(job, snapshot.capacity)
                fits = need is not None and needed + need <= snapshot.capacity
            else:
                fits = _fits(policy, snapshot, accepted + [job])
        if fits:
            needed += need if cheap else 0
            accepted.append(job)
            admitted.append(job)
            continue
        if mode is OverflowMode.DROP:
            dropped.append(job)
        else:
            waiting.append(job)
            blocked = blocked or strict_fifo
    return AdmissionDecision(tuple(admitted), tuple(waiting), tuple(dropped))


def reallocate(snapshot: ClusterSnapshot, policy: Policy, mode: OverflowMode, strict_fifo: bool = True) -> Decision:
    """One interval-Δ step: admit what fits, then allocate GPUs and batch to running + admitted jobs."""
    decision = admit(snapshot, policy, mode, strict_fifo)
    trial = ClusterSnapshot(
        time=snapshot.time,
        capacity=snapshot.capacity,
        running=snapshot.running + tuple(RunningJob(spec=j) for j in decision.admitted),
        queued=(),
        nodes=snapshot.nodes,
    )
    allocation = policy.allocate(trial)
    return Decision(allocation=allocation, admission=decision)
