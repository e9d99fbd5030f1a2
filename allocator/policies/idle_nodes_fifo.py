"""No-rescale FIFO on idle nodes: the comparison point without malleability.

Trainers in FCFS order. A running trainer keeps the nodes it still has (it never grows, and
shrinks only when preemption takes nodes; below N_min it stops and waits). Then waiting
trainers start, in order, on min(N_max, free) nodes while at least N_min are free — strict
FIFO: the first that does not fit blocks the ones behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from allocator.idle_nodes.model import Problem, ScalingCurve, assign_nodes
from allocator.idle_nodes.snapshot_io import ObjectiveKind, NodeRescaleCost, allocation_from_assignment, problem_from_snapshot
from allocator.policies.base import register
from allocator.types import Allocation, ClusterSnapshot


def fifo_counts(problem: Problem) -> tuple[int, ...]:
    counts = [t.c if t.c >= t.nmin else 0 for t in problem.trainers]
    free = len(problem.nodes) - sum(counts)
    for j, t in enumerate(problem.trainers):
        if counts[j]:
            continue
        if free < t.nmin:
            break
        counts[j] = min(t.nmax, free)
        free -= counts[j]
    return tuple(counts)


@dataclass(slots=True)
class IdleNodesFifo:
    curves: dict[str, ScalingCurve] = field(default_factory=dict)
    name: str = "idle_nodes_fifo"

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        problem = problem_from_snapshot(snapshot, 1.0, ObjectiveKind.THROUGHPUT, NodeRescaleCost(), {}, self.curves)
        return allocation_from_assignment(snapshot, assign_nodes(problem, fifo_counts(problem)))


@register("idle_nodes_fifo")
def make_idle_nodes_fifo(curves: dict[str, ScalingCurve] | None = None) -> IdleNodesFifo:
    return IdleNodesFifo(curves=dict(curves or {}))
