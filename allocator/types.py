"""Core types shared by every layer: jobs, profiles, snapshots, allocations, rescale events.

All are frozen, slotted dataclasses validated at construction. A bad value raises
``ValueError`` naming the field and the value, so a message can be shown to a user
as-is. Nothing here knows about clocks, torch, dask or files.

This module is the address every layer imports them from; the profile types
(``allocator.profiles.types``), the allocation types (``allocator.allocation``) and the field
checks (``allocator.checks``) live in their own modules and are re-exported here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum

from allocator.allocation import Allocation, Share, validate_allocation
from allocator.checks import MAX_BATCH, finite_nonneg, positive_int, require
from allocator.profiles.measured_types import MeasuredRate, MeasuredTable
from allocator.physics.noise import NoiseTrajectory
from allocator.profiles.types import AllreduceModel, ThroughputProfile

__all__ = [
    "MAX_BATCH",
    "Allocation",
    "AllreduceModel",
    "ClusterSnapshot",
    "InfeasibleError",
    "JobSpec",
    "MeasuredRate",
    "MeasuredTable",
    "NoiseTrajectory",
    "RescaleEvent",
    "RescaleKind",
    "RunningJob",
    "Share",
    "SizeKnowledge",
    "ThroughputProfile",
    "validate_allocation",
]


class InfeasibleError(Exception):
    """A policy could not find an allocation that gives every admitted job >= its minimum GPUs."""


class SizeKnowledge(str, Enum):
    """How far a job's declared ``total_samples`` can be trusted by a policy that plans with it."""

    EXACT = "exact"  # the job runs exactly its declared work (the executor stops it there)
    ESTIMATE = "estimate"  # a user's estimate ("90 epochs", then it stops early or runs on): a prior, not a fact
    UNKNOWN = "unknown"  # no size worth planning with: a size-aware policy treats the job by its attained service


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user submits: the work, the batch range, the GPU limits, the profile.

    ``min_batch``/``max_batch`` bound the *global* batch (all GPUs together), as seed 000's
    users give them. ``fixed_batch`` is the global batch a non-elastic job (and the
    fixed-batch baselines) run with; ``requested_gpus`` the GPU count a non-elastic job needs (default: ``min_gpus``).

    ``noise_scale`` is the job's gradient noise scale over its progress (``allocator.physics.noise``;
    default: its profile's, else none — every sample counts the same, whatever the batch).
    ``base_batch`` is B0, the batch its ``total_samples`` are counted at when it has one
    (default: ``fixed_batch`` if set, else ``min_batch``; see ``allocator.physics.goodput``).

    ``size`` says how far ``total_samples`` (the declared work, what policies read) can be
    trusted (``SizeKnowledge``). ``actual_samples`` is for simulations only: the work the job
    really does when its declaration is off (default: ``total_samples``); the simulators run it,
    policies never read it.
    """

    id: str
    workload: str
    total_samples: int
    min_batch: int
    max_batch: int
    max_gpus: int
    profile: ThroughputProfile
    elastic: bool = True
    arrival_time: float = 0.0
    min_gpus: int = 1
    requested_gpus: int | None = None
    fixed_batch: int | None = None
    priority: int = 0
    deadline: float | None = None
    seed: int | None = None  # the job's sample order (None: the run's); policies ignore it
    noise_scale: NoiseTrajectory | None = None
    base_batch: int | None = None
    team: str | None = None  # who shares the cluster (allocator.fairness); None: the submitter's team
    submitter: str | None = None  # who submitted it (the service sets it from the store's row)
    size: SizeKnowledge = SizeKnowledge.EXACT
    actual_samples: int | None = None

    def __post_init__(self) -> None:
        owner = f"job {self.id!r}" if isinstance(self.id, str) and self.id else "job"
        require(isinstance(self.id, str) and self.id != "", owner, "id", self.id, "must be a non-empty string")
        require(isinstance(self.workload, str) and self.workload != "", owner, "workload", self.workload, "must be a non-empty string")
        positive_int(owner, "total_samples", self.total_samples)
        positive_int(owner, "min_batch", self.min_batch)
        positive_int(owner, "max_batch", self.max_batch)
        require(self.max_batch <= MAX_BATCH, owner, "max_batch", self.max_batch, f"must be <= {MAX_BATCH:,} (MAX_BATCH)")
        require(self.min_batch <= self.max_batch, owner, "min_batch", self.min_batch, f"is greater than max_batch={self.max_batch}")
        positive_int(owner, "max_gpus", self.max_gpus)
        positive_int(owner, "min_gpus", self.min_gpus)
        require(self.min_gpus <= self.max_gpus, owner, "min_gpus", self.min_gpus, f"is greater than max_gpus={self.max_gpus}")
        if self.requested_gpus is None:
            object.__setattr__(self, "requested_gpus", self.min_gpus)
        positive_int(owner, "requested_gpus", self.requested_gpus)
        require(
            self.min_gpus <= self.requested_gpus <= self.max_gpus,
            owner,
            "requested_gpus",
            self.requested_gpus,
            f"must lie in [min_gpus={self.min_gpus}, max_gpus={self.max_gpus}]",
        )
        require(isinstance(self.elastic, bool), owner, "elastic", self.elastic, "must be true or false")
        finite_nonneg(owner, "arrival_time", self.arrival_time)
        require(isinstance(self.profile, ThroughputProfile), owner, "profile", type(self.profile).__name__, "must be a ThroughputProfile")
        if self.fixed_batch is not None:
            positive_int(owner, "fixed_batch", self.fixed_batch)
            require(
                self.min_batch <= self.fixed_batch <= self.max_batch,
                owner,
                "fixed_batch",
                self.fixed_batch,
                f"must lie in [min_batch={self.min_batch}, max_batch={self.max_batch}]",
            )
        if self.deadline is not None:
            finite_nonneg(owner, "deadline", self.deadline)
        require(isinstance(self.priority, int) and not isinstance(self.priority, bool), owner, "priority", self.priority, "must be an integer")
        if self.seed is not None:
            require(isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0, owner, "seed", self.seed, "must be an integer >= 0")
        if self.noise_scale is None and self.profile.noise_scale is not None:
            object.__setattr__(self, "noise_scale", self.profile.noise_scale)
        require(
            self.noise_scale is None or isinstance(self.noise_scale, NoiseTrajectory),
            owner,
            "noise_scale",
            self.noise_scale,
            "must be a NoiseTrajectory or None",
        )
        for name in ("team", "submitter"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, str) and value.strip() != ""), owner, name, value, "must be a non-empty string or None")
        if self.base_batch is not None:
            positive_int(owner, "base_batch", self.base_batch)
            require(self.base_batch <= MAX_BATCH, owner, "base_batch", self.base_batch, f"must be <= {MAX_BATCH:,} (MAX_BATCH)")
        try:
            object.__setattr__(self, "size", SizeKnowledge(self.size))
        except ValueError:
            require(False, owner, "size", self.size, f"choose one of {', '.join(k.value for k in SizeKnowledge)}")
        if self.actual_samples is not None:
            positive_int(owner, "actual_samples", self.actual_samples)

    @property
    def work_samples(self) -> int:
        """The samples the job really processes before it ends: ``actual_samples`` when a
        simulation gives them, else the declared ``total_samples`` (what a simulator runs)."""
        return self.actual_samples if self.actual_samples is not None else self.total_samples

    @property
    def batch_when_fixed(self) -> int:
        """The global batch a job runs with when its batch may not change."""
        return self.fixed_batch if self.fixed_batch is not None else self.max_batch


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job the cluster knows about, with its current share (None while queued) and progress."""

    spec: JobSpec
    share: Share | None = None
    samples_done: float = 0.0
    noise_scale: float | None = None
    """The job's latest reported gradient noise scale (goodput policies prefer it to a model)."""
    measured: MeasuredTable | None = None
    """What the job measured per configuration (None: its executor measures nothing); ``allocator.profiles.measured``."""
    change_cost_s: float | None = None
    """Seconds of progress a change of this job's GPU count costs it, as its executor charges them
    (None: not known; a policy that weighs the pause uses its own default)."""

    def __post_init__(self) -> None:
        finite_nonneg(f"job {self.spec.id!r}", "samples_done", self.samples_done)
        if self.noise_scale is not None:
            require(
                isinstance(self.noise_scale, (int, float)) and not isinstance(self.noise_scale, bool) and self.noise_scale > 0,
                f"job {self.spec.id!r}",
                "noise_scale",
                self.noise_scale,
                "must be a number > 0 (inf allowed) or None",
            )
        require(
            self.measured is None or isinstance(self.measured, MeasuredTable), f"job {self.spec.id!r}", "measured", self.measured, "must be a MeasuredTable or None"
        )
        if self.change_cost_s is not None:
            finite_nonneg(f"job {self.spec.id!r}", "change_cost_s", self.change_cost_s)

    @property
    def remaining_samples(self) -> float:
        return max(0.0, self.spec.total_samples - self.samples_done)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """What a policy sees: the time, the GPUs, the running jobs, the queue (in arrival order).

    ``nodes`` optionally maps node name -> GPUs on it, for policies that place; when given,
    its GPUs must add up to ``capacity``.
    """

    time: float
    capacity: int
    running: tuple[RunningJob, ...] = ()
    queued: tuple[JobSpec, ...] = ()
    nodes: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        finite_nonneg("ClusterSnapshot", "time", self.time)
        require(
            isinstance(self.capacity, int) and not isinstance(self.capacity, bool) and self.capacity >= 0,
            "ClusterSnapshot",
            "capacity",
            self.capacity,
            "must be an integer >= 0",
        )
        object.__setattr__(self, "running", tuple(self.running))
        object.__setattr__(self, "queued", tuple(self.queued))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        ids = [r.spec.id for r in self.running] + [q.id for q in self.queued]
        dupes = sorted({i for i, n in Counter(ids).items() if n > 1}) if len(set(ids)) != len(ids) else []
        require(not dupes, "ClusterSnapshot", "jobs", dupes, "job ids must be unique across running and queued")
        if self.nodes:
            total = sum(g for _, g in self.nodes)
            require(total == self.capacity, "ClusterSnapshot", "nodes", self.nodes, f"GPUs add up to {total}, not capacity={self.capacity}")
        in_use = sum(r.share.gpus for r in self.running if r.share is not None)
        require(in_use <= self.capacity, "ClusterSnapshot", "running", in_use, f"GPUs in use exceed capacity={self.capacity}")

    @property
    def used_gpus(self) -> int:
        return sum(r.share.gpus for r in self.running if r.share is not None)

    @property
    def free_gpus(self) -> int:
        return self.capacity - self.used_gpus

    @property
    def jobs(self) -> tuple[JobSpec, ...]:
        """Running jobs first (in snapshot order), then queued ones in arrival order."""
        return tuple(r.spec for r in self.running) + self.queued

    def current_share(self, job_id: str) -> Share | None:
        for r in self.running:
            if r.spec.id == job_id:
                return r.share
        return None


class RescaleKind(str, Enum):
    START = "start"
    IN_PLACE = "in_place"
    RESTART = "restart"
    STOP = "stop"
    BATCH = "batch"  # same GPUs, another batch (or accumulation): applied at a step boundary, no regroup


@dataclass(frozen=True, slots=True)
class RescaleEvent:
    """One change to one job's share: when, from what, to what, how, and what it cost."""

    time: float
    job_id: str
    before: Share | None
    after: Share | None
    kind: RescaleKind
    cost_s: float | None = 0.0  # None: measured, but never known (the job ended before it ran in its new shape)
    measured: bool = False

    def __post_init__(self) -> None:
        finite_nonneg("RescaleEvent", "time", self.time)
        if self.cost_s is not None:
            finite_nonneg("RescaleEvent", "cost_s", self.cost_s)
        require(isinstance(self.kind, RescaleKind), "RescaleEvent", "kind", self.kind, "must be a RescaleKind")
        require(
            self.before is not None or self.after is not None, "RescaleEvent", "after", self.after, "before and after cannot both be None"
        )
