"""Seed 000's autoscaler step as a pure function of a snapshot.

An arriving (queued) job is admitted only if every running job plus it can still get its
minimum GPUs under the policy. What does not fit is dropped or stays queued, a setting.
``reallocate`` is the interval-Δ step: admit, then ask the policy for the new allocation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from allocator.protocols import AdmissionDecision, OverflowMode, Policy, SupportsAdmission, SupportsMinGpus, SupportsPreemption
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, RunningJob

__all__ = ["AdmissionDecision", "OverflowMode", "Reallocation", "SupportsAdmission", "admit", "admit_in_order", "reallocate"]


@dataclass(frozen=True, slots=True)
class Reallocation:
    """The outcome of one re-allocation: who runs with what, who waits, who was turned away, and
    which running jobs were taken off the cluster (``preempted``: they wait in the queue again)."""

    allocation: Allocation
    admission: AdmissionDecision
    preempted: tuple[JobSpec, ...] = ()


def _fits(policy: Policy, snapshot: ClusterSnapshot, jobs: list[JobSpec]) -> bool:
    """Seed 000's test by trial solve: can every job in ``jobs`` get its minimum at once?"""
    trial = replace(snapshot, queued=tuple(j for j in jobs if snapshot.current_share(j.id) is None))
    try:
        policy.allocate(trial)
    except InfeasibleError:
        return False
    return True


def admit(snapshot: ClusterSnapshot, policy: Policy, mode: OverflowMode, strict_fifo: bool = True) -> AdmissionDecision:
    """A policy with its own rule (``SupportsAdmission``) decides for itself; any other is
    admitted by ``admit_in_order``."""
    if isinstance(policy, SupportsAdmission):
        return policy.admit(snapshot, mode)
    return admit_in_order(snapshot, policy, mode, strict_fifo)


def admit_in_order(snapshot: ClusterSnapshot, policy: Policy, mode: OverflowMode, strict_fifo: bool = True) -> AdmissionDecision:
    """Add queued jobs one by one, in arrival order, while everyone still fits (seed 000, Fig. 4).

    With ``strict_fifo`` the first job that does not fit blocks the ones behind it (a FIFO
    queue); without it later, smaller jobs may pass (backfill). In DROP mode a job that does
    not fit is rejected now and never retried.
    """
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


def reallocate(snapshot: ClusterSnapshot, policy: Policy, mode: OverflowMode, strict_fifo: bool = True) -> Reallocation:
    """One interval-Δ step: preempt (a policy that does), admit what fits, then allocate GPUs and batch
    to running + admitted jobs. A preempted job is not admitted again in the same step: it waits."""
    taken = set(policy.preempt(snapshot)) if isinstance(policy, SupportsPreemption) else set()
    preempted = tuple(r.spec for r in snapshot.running if r.spec.id in taken)
    running = tuple(r for r in snapshot.running if r.spec.id not in taken)
    decision = admit(replace(snapshot, running=running), policy, mode, strict_fifo)
    trial = ClusterSnapshot(
        time=snapshot.time,
        capacity=snapshot.capacity,
        running=running + tuple(RunningJob(spec=j) for j in decision.admitted),
        queued=(),
        nodes=snapshot.nodes,
    )
    allocation = policy.allocate(trial)
    if preempted:
        waiting = sorted(decision.queued + preempted, key=lambda j: (j.arrival_time, j.id))
        decision = AdmissionDecision(decision.admitted, tuple(waiting), decision.dropped)
    return Reallocation(allocation=allocation, admission=decision, preempted=preempted)
