"""Seed 003's baseline heuristic (Sec. 5.1): split the idle nodes equally among the trainers.

Trainers are taken in FCFS order (running first, then queued, as the snapshot lists them).
The first m trainers share the nodes equally — water-filling, so a trainer capped at N_max
passes its surplus on, and the floor's remainder goes one node each to the earliest —
with m the largest count for which every share reaches its N_min. It ignores rescale
costs and so rescales at almost every event; the paper measures U = 75 % for it against
~80 % for the MILP (Fig. 9-10). Placement keeps the no-migration rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from allocator.idle_nodes.model import Problem, Trainer, assign_nodes
from allocator.idle_nodes.snapshot_io import ObjectiveKind, NodeRescaleCost, allocation_from_assignment, problem_from_snapshot
from allocator.idle_nodes.model import ScalingCurve
from allocator.policies.base import register
from allocator.types import Allocation, ClusterSnapshot


def water_fill(trainers: Sequence[Trainer], nodes: int) -> list[int] | None:
    """Equal shares capped at N_max with the surplus passed on; None if some share < N_min."""
    shares = [0] * len(trainers)
    left, open_ = nodes, list(range(len(trainers)))
    while open_ and left > 0:
        each, extra = divmod(left, len(open_))
        if each == 0 and extra == 0:
            break
        still = []
        for rank, j in enumerate(open_):
            give = min(trainers[j].nmax - shares[j], each + (1 if rank < extra else 0))
            shares[j] += give
            left -= give
            if shares[j] < trainers[j].nmax:
                still.append(j)
        if len(still) == len(open_):
            break
        open_ = still
    if any(s < t.nmin for s, t in zip(shares, trainers)):
        return None
    return shares


def equal_share_counts(problem: Problem) -> tuple[int, ...]:
    trainers = problem.trainers
    for m in range(len(trainers), 0, -1):
        shares = water_fill(trainers[:m], len(problem.nodes))
        if shares is not None:
            return tuple(shares) + (0,) * (len(trainers) - m)
    return (0,) * len(trainers)


@dataclass(slots=True)
class IdleNodesGreedy:
    curves: dict[str, ScalingCurve] = field(default_factory=dict)
    name: str = "idle_nodes_greedy"

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        problem = problem_from_snapshot(snapshot, 1.0, ObjectiveKind.THROUGHPUT, NodeRescaleCost(), {}, self.curves)
        return allocation_from_assignment(snapshot, assign_nodes(problem, equal_share_counts(problem)))


@register("idle_nodes_greedy")
def make_idle_nodes_greedy(curves: dict[str, ScalingCurve] | None = None) -> IdleNodesGreedy:
    return IdleNodesGreedy(curves=dict(curves or {}))
