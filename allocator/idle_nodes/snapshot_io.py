"""Between the shared types and the idle-node model: ClusterSnapshot -> Problem -> Allocation.

Every idle-node policy (MILP, equal-share heuristic, FIFO) reads a snapshot the same way:
``snapshot.nodes`` are the idle nodes (name, GPUs on it; all nodes the same size), a
running job's ``Share.nodes`` are the nodes it holds (those that left the idle set are
its preempted nodes and are dropped), and a job's GPU limits become node limits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np

from allocator.idle_nodes.model import Problem, ScalingCurve, Trainer
from allocator.physics.throughput import rate_table
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, Share


class ObjectiveKind(str, Enum):
    """The paper's objective metrics (Sec. 5.2.1)."""

    THROUGHPUT = "throughput"  # O_j(n) = samples/s on n nodes
    SCALING_EFFICIENCY = "scaling_efficiency"  # O_j(n) / per-node rate at the smallest measured scale: "node-equivalents"


@dataclass(frozen=True, slots=True)
class NodeRescaleCost:
    """R_up / R_dw: seconds a trainer makes no progress when it grows / shrinks (seed 003's
    per-direction cost; the simulator's per-event cost is ``allocator.simulator.RescaleCost``)."""

    up_s: float = 0.0
    down_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("up_s", "down_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"NodeRescaleCost.{name}={v!r}: must be a finite number >= 0")


def node_size(snapshot: ClusterSnapshot) -> int:
    """GPUs per idle node (1 when there are none); mixed sizes are refused."""
    sizes = {g for _, g in snapshot.nodes}
    if not snapshot.nodes:
        if snapshot.capacity:
            raise ValueError(f"ClusterSnapshot.nodes=(): idle-node policies need the node names behind capacity={snapshot.capacity}")
        return 1
    if len(sizes) != 1:
        raise ValueError(f"ClusterSnapshot.nodes={sorted(sizes)!r}: idle-node policies need every node to have the same GPU count")
    return sizes.pop()


def node_limits(spec: JobSpec, gpus_per_node: int) -> tuple[int, int]:
    """N_min, N_max from the job's GPU limits; InfeasibleError when no whole node count fits
    (a valid job, just not on these nodes — the loop keeps it waiting, as for elastic_dp)."""
    nmin, nmax = -(-spec.min_gpus // gpus_per_node), spec.max_gpus // gpus_per_node
    if nmax < nmin:
        raise InfeasibleError(f"job {spec.id!r}.max_gpus={spec.max_gpus}: no whole number of {gpus_per_node}-GPU nodes fits in [{spec.min_gpus}, {spec.max_gpus}]")
    return nmin, nmax


def runnable_node_limits(spec: JobSpec, gpus_per_node: int) -> tuple[int, int]:
    """``node_limits`` narrowed to the node counts where some batch in [min_batch, max_batch]
    fits (at least one sample, at most the memory cap per GPU) — a contiguous range, since
    the fitting GPU counts are [ceil(min_batch / cap), max_batch]. InfeasibleError if none."""
    nmin, nmax = node_limits(spec, gpus_per_node)
    table = rate_table(spec, nmax * gpus_per_node)
    fits = [n for n in range(nmin, nmax + 1) if math.isfinite(table.rates[n * gpus_per_node])]
    if not fits:
        raise InfeasibleError(
            f"job {spec.id!r}: no batch in [{spec.min_batch}, {spec.max_batch}] fits on {nmin}..{nmax} node(s) of {gpus_per_node} GPU(s)"
        )
    return fits[0], fits[-1]


def breakpoints(nmin: int, nmax: int) -> tuple[int, ...]:
    """nmin, the powers of two in between, nmax: the paper's few discretization points (Fig. 4)."""
    pts = {nmin, nmax}
    p = 1
    while p < nmax:
        if p > nmin:
            pts.add(p)
        p *= 2
    return tuple(sorted(pts))


def curve_from_profile(spec: JobSpec, gpus_per_node: int, nmin: int, nmax: int) -> ScalingCurve:
    """Samples/s at the breakpoints from the job's throughput model (best batch per scale)."""
    table = rate_table(spec, nmax * gpus_per_node)
    pts = breakpoints(nmin, nmax)
    vals = [float(table.rates[n * gpus_per_node]) for n in pts]
    bad = [n for n, v in zip(pts, vals) if not math.isfinite(v)]
    if bad:
        raise ValueError(f"job {spec.id!r}: no batch in [{spec.min_batch}, {spec.max_batch}] fits on {bad[0]} node(s) of {gpus_per_node} GPU(s)")
    return ScalingCurve(pts, vals)


def objective_curve(curve: ScalingCurve, kind: ObjectiveKind) -> ScalingCurve:
    if kind is ObjectiveKind.THROUGHPUT:
        return curve
    per_node = curve.values[0] / curve.nodes[0]
    if per_node <= 0:
        raise ValueError(f"ScalingCurve.values[0]={curve.values[0]!r}: scaling efficiency needs a positive smallest-scale rate")
    return curve.scaled(1.0 / per_node)


def job_curve(spec: JobSpec, gpus_per_node: int, curves: Mapping[str, ScalingCurve]) -> tuple[int, int, ScalingCurve]:
    """N_min, N_max and the samples/s curve: a given curve (by job id, then workload) within
    the job's node limits, or one from its profile over the node counts its batch fits."""
    given = curves.get(spec.id) or curves.get(spec.workload)
    if given is not None:
        return (*node_limits(spec, gpus_per_node), given)
    nmin, nmax = runnable_node_limits(spec, gpus_per_node)
    return nmin, nmax, curve_from_profile(spec, gpus_per_node, nmin, nmax)


def problem_from_snapshot(
    snapshot: ClusterSnapshot,
    t_fwd: float,
    objective: ObjectiveKind,
    default_cost: NodeRescaleCost,
    costs: Mapping[str, NodeRescaleCost],
    curves: Mapping[str, ScalingCurve],
) -> Problem:
    g = node_size(snapshot)
    idle = tuple(name for name, _ in snapshot.nodes)
    idle_set = set(idle)
    trainers = []
    for spec in snapshot.jobs:
        nmin, nmax, curve = job_curve(spec, g, curves)
        share = snapshot.current_share(spec.id)
        current = tuple(n for n in share.nodes if n in idle_set) if share is not None else ()
        cost = costs.get(spec.id) or costs.get(spec.workload) or default_cost
        curve = objective_curve(curve, objective)
        trainers.append(Trainer(spec.id, nmin, nmax, curve, current, cost.up_s, cost.down_s))
    return Problem(idle, tuple(trainers), t_fwd)


def allocation_from_assignment(snapshot: ClusterSnapshot, assignment: Mapping[str, tuple[str, ...]]) -> Allocation:
    """Shares in snapshot job order: GPUs = nodes x GPUs per node, the best batch for that scale."""
    g = node_size(snapshot)
    shares = []
    for spec in snapshot.jobs:
        nodes = assignment.get(spec.id, ())
        if not nodes:
            continue
        k = len(nodes) * g
        table = rate_table(spec, k)
        if math.isfinite(table.rates[k]):
            batch = int(table.batches[k])
        else:
            lo, hi = max(k, spec.min_batch), min(spec.max_batch, k * spec.profile.max_batch_per_gpu)
            if lo > hi:
                raise ValueError(f"job {spec.id!r}: no global batch in [{spec.min_batch}, {spec.max_batch}] fits {k} GPUs")
            batch = hi
        shares.append((spec.id, Share(gpus=k, global_batch=batch, nodes=tuple(nodes))))
    return Allocation(tuple(shares))


def as_array(curve: ScalingCurve, upto: int) -> np.ndarray:
    """O(n) for n = 0..upto (0 outside the curve's range), for DP-style baselines."""
    out = np.zeros(upto + 1)
    for n in range(curve.nodes[0], min(upto, curve.nodes[-1]) + 1):
        out[n] = curve.value(n)
    return out
