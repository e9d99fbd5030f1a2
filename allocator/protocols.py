"""The interfaces at the bottom of ``allocator/``: what a policy is, and what an admission
step decides. They import only the core types, so policies, admission and the loop can all
import them at module level without a cycle (and without lazy imports to dodge one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from allocator.overflow import OverflowMode
from allocator.types import Allocation, ClusterSnapshot, JobSpec

__all__ = ["AdmissionDecision", "OverflowMode", "Policy", "SupportsAdmission", "SupportsMinGpus", "SupportsPreemption"]


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    admitted: tuple[JobSpec, ...]
    queued: tuple[JobSpec, ...]
    dropped: tuple[JobSpec, ...]


@runtime_checkable
class Policy(Protocol):
    name: str

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        """Shares for every job in the snapshot (running and queued); InfeasibleError if some
        job cannot get its minimum."""
        ...


@runtime_checkable
class SupportsMinGpus(Protocol):
    """A policy that can say, without solving, the fewest GPUs a job needs under it.

    Admission uses it for seed 000's feasibility test (every job >= its minimum) in O(1)
    per job instead of one full solve per queued job.
    """

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None: ...


@runtime_checkable
class SupportsAdmission(Protocol):
    """A policy with its own admission rule (queue discipline, start condition), e.g. Elan's E-BF."""

    def admit(self, snapshot: ClusterSnapshot, mode: OverflowMode) -> AdmissionDecision: ...


@runtime_checkable
class SupportsPreemption(Protocol):
    """A policy that may take a running job off the cluster altogether (the fairness layer, when
    shrinking in place cannot give a team its quota back: a borrower's jobs need more GPUs at their
    minimum than its share). A preempted job goes back to the queue and keeps its progress: the
    executor stops it (the real one from a checkpoint), and it restarts when admitted again."""

    def preempt(self, snapshot: ClusterSnapshot) -> tuple[str, ...]: ...
