"""Core types shared by every layer: jobs, profiles, snapshots, allocations, rescale events.

All are frozen, slotted dataclasses validated at construction. A bad value raises
``ValueError`` naming the field and the value, so a message can be shown to a user
as-is. Nothing here knows about clocks, torch, dask or files.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum


# The largest batch (global, or per GPU) accepted: about a million samples, far above any
# published large-batch run. Rate tables hold one candidate per per-GPU batch, so a typo
# such as 1e15 would otherwise make numpy try to allocate petabytes.
MAX_BATCH = 2**20


class InfeasibleError(Exception):
    """A policy could not find an allocation that gives every admitted job >= its minimum GPUs."""


def _require(condition: bool, owner: str, field_name: str, value: object, why: str) -> None:
    if not condition:
        raise ValueError(f"{owner}.{field_name}={value!r}: {why}")


def _positive_int(owner: str, name: str, value: object) -> None:
    _require(
        isinstance(value, int) and not isinstance(value, bool) and value > 0,
        owner,
        name,
        value,
        "must be a positive integer",
    )


def _finite_nonneg(owner: str, name: str, value: object) -> None:
    _require(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0,
        owner,
        name,
        value,
        "must be a finite number >= 0",
    )


@dataclass(frozen=True, slots=True)
class AllreduceModel:
    """Ring-allreduce time for p parameters over k workers.

    t_comm(p, k) = 2 (k - 1) * latency_s + 2 (k - 1) / k * p * seconds_per_param, and 0 for k = 1.
    ``seconds_per_param`` folds bytes per parameter and link bandwidth together; both
    coefficients come from a least-squares fit of measured allreduce times.
    """

    latency_s: float = 0.0
    seconds_per_param: float = 0.0

    def __post_init__(self) -> None:
        _finite_nonneg("AllreduceModel", "latency_s", self.latency_s)
        _finite_nonneg("AllreduceModel", "seconds_per_param", self.seconds_per_param)


@dataclass(frozen=True, slots=True)
class ThroughputProfile:
    """Measured per-iteration time on one GPU against per-GPU batch, plus an allreduce fit.

    ``batch_sizes`` are per-GPU batch sizes, strictly increasing; ``iter_times_s`` the
    matching forward+backward+step times, non-decreasing (a larger batch never takes less
    time — anything else is a measurement error we refuse rather than interpolate).
    ``max_batch_per_gpu`` is the memory cap: the largest per-GPU batch that fits.
    ``inter_host`` optionally fits allreduce across hosts separately (``allreduce`` then
    holds the intra-host fit); None: one fit for both.
    """

    workload: str
    num_params: int
    batch_sizes: tuple[int, ...]
    iter_times_s: tuple[float, ...]
    max_batch_per_gpu: int
    allreduce: AllreduceModel = field(default_factory=AllreduceModel)
    hardware: str = "unknown"
    inter_host: AllreduceModel | None = None

    def __post_init__(self) -> None:
        owner = f"ThroughputProfile[{self.workload}]"
        _require(isinstance(self.workload, str) and self.workload != "", owner, "workload", self.workload, "must be a non-empty string")
        _positive_int(owner, "num_params", self.num_params)
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        object.__setattr__(self, "iter_times_s", tuple(float(t) for t in self.iter_times_s))
        _require(len(self.batch_sizes) > 0, owner, "batch_sizes", self.batch_sizes, "profile is empty: need at least one measured point")
        _require(
            len(self.batch_sizes) == len(self.iter_times_s),
            owner,
            "iter_times_s",
            self.iter_times_s,
            f"has {len(self.iter_times_s)} values for {len(self.batch_sizes)} batch sizes",
        )
        for b in self.batch_sizes:
            _positive_int(owner, "batch_sizes", b)
        for t in self.iter_times_s:
            _require(math.isfinite(t) and t > 0, owner, "iter_times_s", self.iter_times_s, "every time must be finite and > 0")
        for a, b in zip(self.batch_sizes, self.batch_sizes[1:]):
            _require(b > a, owner, "batch_sizes", self.batch_sizes, "must be strictly increasing")
        for i, (a, b) in enumerate(zip(self.iter_times_s, self.iter_times_s[1:]), start=1):
            _require(
                b >= a,
                owner,
                f"iter_times_s[{i}]",
                b,
                f"at batch {self.batch_sizes[i]} is below iter_times_s[{i - 1}]={a!r} at batch {self.batch_sizes[i - 1]}; "
                "times must be non-decreasing in batch size (a non-monotone profile; for measured noise use the monotone envelope)",
            )
        _positive_int(owner, "max_batch_per_gpu", self.max_batch_per_gpu)
        _require(self.max_batch_per_gpu <= MAX_BATCH, owner, "max_batch_per_gpu", self.max_batch_per_gpu, f"must be <= {MAX_BATCH:,} (MAX_BATCH)")
        _require(isinstance(self.allreduce, AllreduceModel), owner, "allreduce", self.allreduce, "must be an AllreduceModel")
        _require(
            self.inter_host is None or isinstance(self.inter_host, AllreduceModel), owner, "inter_host", self.inter_host, "must be an AllreduceModel or None"
        )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user submits: the work, the batch range, the GPU limits, the profile.

    ``min_batch``/``max_batch`` bound the *global* batch (all GPUs together), as seed 000's
    users give them. ``fixed_batch`` is the global batch a non-elastic job (and the
    fixed-batch baselines) run with; ``requested_gpus`` the GPU count a non-elastic job needs (default: ``min_gpus``).
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

    def __post_init__(self) -> None:
        owner = f"job {self.id!r}" if isinstance(self.id, str) and self.id else "job"
        _require(isinstance(self.id, str) and self.id != "", owner, "id", self.id, "must be a non-empty string")
        _require(isinstance(self.workload, str) and self.workload != "", owner, "workload", self.workload, "must be a non-empty string")
        _positive_int(owner, "total_samples", self.total_samples)
        _positive_int(owner, "min_batch", self.min_batch)
        _positive_int(owner, "max_batch", self.max_batch)
        _require(self.max_batch <= MAX_BATCH, owner, "max_batch", self.max_batch, f"must be <= {MAX_BATCH:,} (MAX_BATCH)")
        _require(self.min_batch <= self.max_batch, owner, "min_batch", self.min_batch, f"is greater than max_batch={self.max_batch}")
        _positive_int(owner, "max_gpus", self.max_gpus)
        _positive_int(owner, "min_gpus", self.min_gpus)
        _require(self.min_gpus <= self.max_gpus, owner, "min_gpus", self.min_gpus, f"is greater than max_gpus={self.max_gpus}")
        if self.requested_gpus is None:
            object.__setattr__(self, "requested_gpus", self.min_gpus)
        _positive_int(owner, "requested_gpus", self.requested_gpus)
        _require(
            self.min_gpus <= self.requested_gpus <= self.max_gpus,
            owner,
            "requested_gpus",
            self.requested_gpus,
            f"must lie in [min_gpus={self.min_gpus}, max_gpus={self.max_gpus}]",
        )
        _require(isinstance(self.elastic, bool), owner, "elastic", self.elastic, "must be true or false")
        _finite_nonneg(owner, "arrival_time", self.arrival_time)
        _require(isinstance(self.profile, ThroughputProfile), owner, "profile", type(self.profile).__name__, "must be a ThroughputProfile")
        if self.fixed_batch is not None:
            _positive_int(owner, "fixed_batch", self.fixed_batch)
            _require(
                self.min_batch <= self.fixed_batch <= self.max_batch,
                owner,
                "fixed_batch",
                self.fixed_batch,
                f"must lie in [min_batch={self.min_batch}, max_batch={self.max_batch}]",
            )
        if self.deadline is not None:
            _finite_nonneg(owner, "deadline", self.deadline)
        _require(isinstance(self.priority, int) and not isinstance(self.priority, bool), owner, "priority", self.priority, "must be an integer")

    @property
    def batch_when_fixed(self) -> int:
        """The global batch a job runs with when its batch may not change."""
        return self.fixed_batch if self.fixed_batch is not None else self.max_batch


@dataclass(frozen=True, slots=True)
class Share:
    """One job's slice of the cluster: GPUs, global batch, gradient-accumulation steps, nodes.

    The global batch is split as evenly as possible over ``gpus * accum_steps`` micro-batches,
    so ranks hold ceil or floor of ``batch / (gpus * accum_steps)`` samples — seed 000's
    t_proc(ceil(b / k)) is the slowest rank's time.
    """

    gpus: int
    batch: int
    accum_steps: int = 1
    nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _positive_int("Share", "gpus", self.gpus)
        _positive_int("Share", "batch", self.batch)
        _positive_int("Share", "accum_steps", self.accum_steps)
        _require(
            self.batch >= self.gpus * self.accum_steps,
            "Share",
            "batch",
            self.batch,
            f"gives some of the {self.gpus} GPUs x {self.accum_steps} accumulation steps no sample",
        )
        object.__setattr__(self, "nodes", tuple(self.nodes))

    @property
    def batch_per_gpu(self) -> int:
        """Largest micro-batch any rank processes in one forward/backward."""
        return -(-self.batch // (self.gpus * self.accum_steps))


@dataclass(frozen=True, slots=True)
class Allocation:
    """Job id -> Share, for the jobs that run. Jobs absent from it get nothing.

    Stored as a tuple of pairs in a stable order (the order the policy produced them) so
    that equal allocations compare and print identically; an index makes lookups O(1).
    """

    shares: tuple[tuple[str, Share], ...] = ()
    _index: dict[str, Share] = field(init=False, repr=False, compare=False, hash=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shares", tuple(self.shares))
        index: dict[str, Share] = {}
        for job_id, share in self.shares:
            _require(job_id not in index, "Allocation", "shares", job_id, "job appears twice")
            _require(isinstance(share, Share), "Allocation", f"shares[{job_id}]", share, "must be a Share")
            index[job_id] = share
        object.__setattr__(self, "_index", index)

    @classmethod
    def of(cls, shares: Mapping[str, Share]) -> Allocation:
        return cls(tuple(shares.items()))

    def __getitem__(self, job_id: str) -> Share:
        return self._index[job_id]

    def get(self, job_id: str) -> Share | None:
        return self._index.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._index

    def __iter__(self) -> Iterator[str]:
        return (jid for jid, _ in self.shares)

    def __len__(self) -> int:
        return len(self.shares)

    def as_dict(self) -> dict[str, Share]:
        return dict(self.shares)

    @property
    def total_gpus(self) -> int:
        return sum(share.gpus for _, share in self.shares)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job the cluster knows about, with its current share (None while queued) and progress."""

    spec: JobSpec
    share: Share | None = None
    samples_done: float = 0.0
    noise_scale: float | None = None
    """The job's latest reported gradient noise scale (goodput policies prefer it to a model)."""

    def __post_init__(self) -> None:
        _finite_nonneg(f"job {self.spec.id!r}", "samples_done", self.samples_done)
        if self.noise_scale is not None:
            _require(
                isinstance(self.noise_scale, (int, float)) and not isinstance(self.noise_scale, bool) and self.noise_scale > 0,
                f"job {self.spec.id!r}",
                "noise_scale",
                self.noise_scale,
                "must be a number > 0 (inf allowed) or None",
            )

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
        _finite_nonneg("ClusterSnapshot", "time", self.time)
        _require(
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
        _require(not dupes, "ClusterSnapshot", "jobs", dupes, "job ids must be unique across running and queued")
        if self.nodes:
            total = sum(g for _, g in self.nodes)
            _require(total == self.capacity, "ClusterSnapshot", "nodes", self.nodes, f"GPUs add up to {total}, not capacity={self.capacity}")
        in_use = sum(r.share.gpus for r in self.running if r.share is not None)
        _require(in_use <= self.capacity, "ClusterSnapshot", "running", in_use, f"GPUs in use exceed capacity={self.capacity}")

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


@dataclass(frozen=True, slots=True)
class RescaleEvent:
    """One change to one job's share: when, from what, to what, how, and what it cost."""

    time: float
    job_id: str
    before: Share | None
    after: Share | None
    kind: RescaleKind
    cost_s: float = 0.0
    measured: bool = False

    def __post_init__(self) -> None:
        _finite_nonneg("RescaleEvent", "time", self.time)
        _finite_nonneg("RescaleEvent", "cost_s", self.cost_s)
        _require(isinstance(self.kind, RescaleKind), "RescaleEvent", "kind", self.kind, "must be a RescaleKind")
        _require(
            self.before is not None or self.after is not None, "RescaleEvent", "after", self.after, "before and after cannot both be None"
        )


def validate_allocation(allocation: Allocation, snapshot: ClusterSnapshot, required: Sequence[str] = ()) -> None:
    """Check an allocation against the snapshot it answers; raise ValueError on any breach.

    Capacity, each job's min/max GPUs, batch range and memory cap, unknown job ids, and
    that every job in ``required`` (the admitted jobs) got at least its minimum.
    """
    specs = {j.id: j for j in snapshot.jobs}
    for job_id, share in allocation.shares:
        _require(job_id in specs, "Allocation", "job", job_id, "is not in the snapshot")
        spec = specs[job_id]
        owner = f"allocation for job {job_id!r}"
        _require(spec.min_gpus <= share.gpus <= spec.max_gpus, owner, "gpus", share.gpus, f"outside [{spec.min_gpus}, {spec.max_gpus}]")
        _require(
            share.batch_per_gpu <= spec.profile.max_batch_per_gpu,
            owner,
            "batch_per_gpu",
            share.batch_per_gpu,
            f"exceeds the memory cap {spec.profile.max_batch_per_gpu}",
        )
        _require(
            spec.min_batch <= share.batch <= spec.max_batch,
            owner,
            "batch",
            share.batch,
            f"outside [{spec.min_batch}, {spec.max_batch}]",
        )
    _require(
        allocation.total_gpus <= snapshot.capacity,
        "Allocation",
        "total_gpus",
        allocation.total_gpus,
        f"exceeds capacity={snapshot.capacity}",
    )
    for job_id in required:
        _require(job_id in allocation, "Allocation", "job", job_id, "was admitted but got no GPUs")
