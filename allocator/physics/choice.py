"""Which physics a run of jobs is judged on: one per run, for every policy compared in it.

When any job carries a gradient noise scale, every job progresses by goodput: base-batch-
equivalent samples at T(B, k) E(B), E = (B_noise + B0) / (B_noise + B) (``allocator.physics.goodput``;
a job without a noise scale counts every sample, E = 1). Otherwise by throughput: samples at
T(B, k). The simulator, ``plan`` and the service pick it here; a policy whose own model of the
noise contradicts the jobs' is refused (``check_physics``) rather than left to decide on
batches the physics never charges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Protocol, runtime_checkable

from allocator.protocols import Policy
from allocator.types import JobSpec


class Physics(str, Enum):
    """How a job's work is counted and advanced."""

    THROUGHPUT = "throughput"  # samples at T(B, k): every sample counts the same
    GOODPUT = "goodput"  # base-batch-equivalent samples at T(B, k) E(B), E from each job's noise scale


def physics_of(jobs: Iterable[JobSpec]) -> Physics:
    """Goodput as soon as one job carries a noise scale, else throughput."""
    return Physics.GOODPUT if any(j.noise_scale is not None for j in jobs) else Physics.THROUGHPUT


@runtime_checkable
class SupportsPhysicsCheck(Protocol):
    """A policy that models part of the physics (a noise scale) and can say when its model
    contradicts the jobs' own: ValueError naming its parameter and value."""

    def check_physics(self, jobs: Sequence[JobSpec], gpus_per_host: int | None = None) -> None: ...


def check_physics(policy: Policy, jobs: Sequence[JobSpec], gpus_per_host: int | None = None) -> None:
    """``gpus_per_host``: the hosts the physics places jobs on (None: one flat network)."""
    if isinstance(policy, SupportsPhysicsCheck):
        policy.check_physics(jobs, gpus_per_host)
