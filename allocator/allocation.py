"""What a policy answers: each job's ``Share`` of the cluster, and the checks an ``Allocation`` must pass."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from allocator.checks import positive_int, require

if TYPE_CHECKING:  # only named in a signature; the snapshot module imports this one
    from allocator.types import ClusterSnapshot


@dataclass(frozen=True, slots=True)
class Share:
    """One job's slice of the cluster: GPUs, global batch, gradient-accumulation steps, nodes.

    The global batch is split as evenly as possible over ``gpus * accum_steps`` micro-batches,
    so ranks hold ceil or floor of ``global_batch / (gpus * accum_steps)`` samples — seed 000's
    t_proc(ceil(b / k)) is the slowest rank's time.
    """

    gpus: int
    global_batch: int
    accum_steps: int = 1
    nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        positive_int("Share", "gpus", self.gpus)
        positive_int("Share", "global_batch", self.global_batch)
        positive_int("Share", "accum_steps", self.accum_steps)
        require(
            self.global_batch >= self.gpus * self.accum_steps,
            "Share",
            "global_batch",
            self.global_batch,
            f"gives some of the {self.gpus} GPUs x {self.accum_steps} accumulation steps no sample",
        )
        object.__setattr__(self, "nodes", tuple(self.nodes))

    @property
    def batch_per_gpu(self) -> int:
        """Largest micro-batch any rank processes in one forward/backward."""
        return -(-self.global_batch // (self.gpus * self.accum_steps))


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
            require(job_id not in index, "Allocation", "shares", job_id, "job appears twice")
            require(isinstance(share, Share), "Allocation", f"shares[{job_id}]", share, "must be a Share")
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


def validate_allocation(allocation: Allocation, snapshot: ClusterSnapshot, required: Sequence[str] = ()) -> None:
    """Check an allocation against the snapshot it answers; raise ValueError on any breach.

    Capacity, each job's min/max GPUs, batch range and memory cap, unknown job ids, and
    that every job in ``required`` (the admitted jobs) got at least its minimum.
    """
    specs = {j.id: j for j in snapshot.jobs}
    for job_id, share in allocation.shares:
        require(job_id in specs, "Allocation", "job", job_id, "is not in the snapshot")
        spec = specs[job_id]
        owner = f"allocation for job {job_id!r}"
        require(spec.min_gpus <= share.gpus <= spec.max_gpus, owner, "gpus", share.gpus, f"outside [{spec.min_gpus}, {spec.max_gpus}]")
        require(
            share.batch_per_gpu <= spec.profile.max_batch_per_gpu,
            owner,
            "batch_per_gpu",
            share.batch_per_gpu,
            f"exceeds the memory cap {spec.profile.max_batch_per_gpu}",
        )
        require(
            spec.min_batch <= share.global_batch <= spec.max_batch,
            owner,
            "global_batch",
            share.global_batch,
            f"outside [{spec.min_batch}, {spec.max_batch}]",
        )
    require(
        allocation.total_gpus <= snapshot.capacity,
        "Allocation",
        "total_gpus",
        allocation.total_gpus,
        f"exceeds capacity={snapshot.capacity}",
    )
    for job_id in required:
        require(job_id in allocation, "Allocation", "job", job_id, "was admitted but got no GPUs")
