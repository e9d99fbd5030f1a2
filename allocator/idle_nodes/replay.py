"""Event-driven replay of an idle-node trace: trainers on nodes that come and go (seed 003 Sec. 4-5).

At every event (nodes join and/or leave N, or a trainer completes) the replay:

1. advances each trainer's progress at O_j(n_j) samples/s, except while it is stalled by a
   rescale (R_up after growing or starting, R_dw after shrinking);
2. applies the node changes; a trainer that loses nodes is *preempted*: it shrinks to its
   surviving nodes and stalls R_dw (or stops if it falls below N_min);
3. asks the policy for a new allocation on a ``ClusterSnapshot`` whose ``nodes`` are the
   idle nodes and whose running shares carry their node lists; the answer is checked
   (one trainer per node, limits, no migration) before it is applied.

The shared ``allocator.loop.run_loop`` models a fixed capacity, so this is its own small
loop over node events with the same types, the same Policy protocol and frozen result
records. Metrics are the paper's (Sec. 4.1): R = integral of |N| (Eqn. 17), N_eq = R / t
(Eqn. 18), A_e = samples processed, A_s = samples the same trainers would process on N_eq
static nodes in the best static split with no costs, U = A_e / A_s.
"""

from __future__ import annotations

import dataclasses

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from allocator.idle_nodes.model import ScalingCurve
from allocator.idle_nodes.snapshot_io import NodeRescaleCost
from allocator.idle_nodes.trace import IdleTrace, idle_integral
from allocator.policies.base import Policy
from allocator.types import AllreduceModel, ClusterSnapshot, JobSpec, RunningJob, Share, ThroughputProfile

SAMPLES_PER_NODE_STEP = 192  # seed 003: 32 samples per GPU x 6 GPUs per Summit node (Table 2)


def trainer_spec(job_id: str, workload: str, curve: ScalingCurve, total_samples: int, nmin: int = 1, nmax: int = 64, arrival: float = 0.0) -> JobSpec:
    """A JobSpec for a trainer whose speed is given by a scaling curve (one node = one unit).

    The profile only fixes the per-node batch (weak scaling, as the paper runs); speeds come
    from the curve, which the policies and the replay both receive.
    """
    b = SAMPLES_PER_NODE_STEP
    profile = ThroughputProfile(workload, 1, (b,), (b / curve.values[0] * curve.nodes[0],), b, AllreduceModel(), "summit-node")
    return JobSpec(id=job_id, workload=workload, total_samples=total_samples, min_batch=b * nmin, max_batch=b * nmax,
                   max_gpus=nmax, min_gpus=nmin, profile=profile, arrival_time=arrival)


@dataclass(frozen=True, slots=True)
class NodeScheduleRow:
    """A replay row: from ``time`` on, ``job_id`` holds ``nodes`` idle nodes (the loop's
    ``ScheduleRow`` counts GPUs and batch instead)."""

    time: float
    job_id: str
    nodes: int
    cause: str  # "policy", "preempted" or "completed"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    policy: str
    start: float
    end: float
    node_seconds: float  # R of Eqn. 17, in node-seconds
    n_eq: float
    samples: float  # A_e
    static_samples: float  # A_s
    utilisation: float  # U = A_e / A_s
    events: int
    decisions: int
    grows: int
    shrinks: int
    starts: int
    stops: int
    preemptions: int
    rescale_loss_samples: float  # progress not made while stalled by policy rescales
    completed: tuple[str, ...]
    solve_s: tuple[float, ...]
    fallbacks: int  # decisions where the MILP kept the current map (time-out, infeasible, error)
    schedule: tuple[NodeScheduleRow, ...]

    @property
    def throughput(self) -> float:
        return self.samples / max(self.end - self.start, 1e-9)

    @property
    def rescales(self) -> int:
        return self.grows + self.shrinks + self.starts + self.stops

    @property
    def median_solve_s(self) -> float:
        return statistics.median(self.solve_s) if self.solve_s else 0.0

    @property
    def max_solve_s(self) -> float:
        return max(self.solve_s, default=0.0)


def best_static_rate(curves: Sequence[ScalingCurve], nodes: float, limits: Sequence[tuple[int, int]]) -> float:
    """max sum_j O_j(n_j) with sum n_j <= nodes (fractional nodes: linear between floor and ceil)."""

    def at_most(k: int) -> float:
        best = np.zeros(k + 1)  # best[m]: best total rate with at most m nodes over jobs so far
        for curve, (lo, hi) in zip(curves, limits):
            new = best.copy()
            for n in range(lo, min(hi, k) + 1):
                cand = best[: k + 1 - n] + curve.value(n)
                new[n:] = np.maximum(new[n:], cand)
            best = new
        return float(best[k])

    lo = math.floor(nodes)
    frac = nodes - lo
    v = at_most(lo)
    return v if frac == 0 else v + frac * (at_most(lo + 1) - v)


@dataclass(slots=True)
class _Counts:
    """What a replay counted as it went (ReplayResult carries the totals)."""

    events: int = 0
    decisions: int = 0
    grows: int = 0
    shrinks: int = 0
    starts: int = 0
    stops: int = 0
    preemptions: int = 0
    fallbacks: int = 0


@dataclass(slots=True)
class _Job:
    spec: JobSpec
    curve: ScalingCurve
    cost: NodeRescaleCost
    share: Share | None = None
    done: float = 0.0
    stall_until: float = -math.inf
    finished: float | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.share.nodes if self.share is not None else ()

    def rate(self) -> float:
        n = len(self.nodes)
        return self.curve.value(n) if n else 0.0

    def advance(self, t0: float, t1: float) -> float:
        """Progress in [t0, t1]; returns the samples lost to a stall in that window."""
        if not self.nodes or t1 <= t0:
            return 0.0
        productive = max(0.0, t1 - max(t0, self.stall_until))
        self.done = min(float(self.spec.total_samples), self.done + self.rate() * productive)
        return self.rate() * (t1 - t0 - productive)

    def completion_time(self, now: float) -> float:
        if not self.nodes or self.finished is not None:
            return math.inf
        r = self.rate()
        return max(now, self.stall_until) + (self.spec.total_samples - self.done) / r if r > 0 else math.inf


def with_run_model(policy: Policy, curves: Mapping[str, ScalingCurve], costs: Mapping[str, NodeRescaleCost], default_cost: NodeRescaleCost) -> Policy:
    """A policy that plans with scaling curves and rescale costs takes the run's where it was given
    none of its own, so one policy name plans alike by every route (the CLI, a Python replay)."""
    fill: dict[str, object] = {}
    if getattr(policy, "curves", None) == {}:
        fill["curves"] = dict(curves)
    if hasattr(policy, "default_cost") and getattr(policy, "default_cost") is None:
        fill["default_cost"] = default_cost
        if getattr(policy, "costs", None) == {}:
            fill["costs"] = dict(costs)
    return dataclasses.replace(policy, **fill) if fill else policy  # type: ignore[type-var]


def replay(
    trace: IdleTrace,
    jobs: Sequence[JobSpec],
    policy: Policy,
    curves: Mapping[str, ScalingCurve],
    costs: Mapping[str, NodeRescaleCost] | None = None,
    default_cost: NodeRescaleCost = NodeRescaleCost(20.0, 5.0),
    max_parallel: int = 10,
    start: float | None = None,
    end: float | None = None,
) -> ReplayResult:
    """Replay ``trace`` from ``start`` to ``end`` (default: the whole trace) under ``policy``."""
    if max_parallel < 1:
        raise ValueError(f"max_parallel={max_parallel!r}: must be >= 1")
    costs = costs or {}
    policy = with_run_model(policy, curves, costs, default_cost)
    missing = sorted({j.workload for j in jobs} - set(curves) - {j.id for j in jobs if j.id in curves})
    if missing:
        raise ValueError(f"curves: no scaling curve for workload(s) {missing}")
    events = trace.events()
    t_start = events[0][0] if start is None and events else (start or 0.0)
    t_end = trace.end_time if end is None else end
    if t_end <= t_start:
        raise ValueError(f"end={t_end!r}: must be after start={t_start!r}")
    state = [_Job(j, curves.get(j.id) or curves[j.workload], costs.get(j.id) or costs.get(j.workload) or default_cost) for j in jobs]
    idle: dict[str, None] = {}  # insertion-ordered set: deterministic node order
    ei = 0
    while ei < len(events) and events[ei][0] <= t_start:  # nodes already idle at the start
        for c in events[ei][1]:
            (idle.__setitem__(c.node, None) if c.idle else idle.pop(c.node, None))
        ei += 1
    schedule: list[NodeScheduleRow] = []
    solve_s: list[float] = []
    counts = _Counts()
    lost = 0.0
    now = t_start

    def decide(t: float) -> None:
        nonlocal lost
        active = [j for j in state if j.finished is None and j.spec.arrival_time <= t][:max_parallel]
        running = tuple(RunningJob(j.spec, j.share, j.done) for j in active if j.share is not None)
        queued = tuple(j.spec for j in active if j.share is None)
        snapshot = ClusterSnapshot(time=t, capacity=len(idle), running=running, queued=queued, nodes=tuple((n, 1) for n in idle))
        t0 = time.perf_counter()
        allocation = policy.allocate(snapshot)
        solve_s.append(time.perf_counter() - t0)
        last = getattr(policy, "last", None)
        if last is not None and getattr(last, "kept_previous", False):
            counts.fallbacks += 1
        counts.decisions += 1
        owner: dict[str, str] = {}
        for job_id, share in allocation.shares:
            for n in share.nodes:
                if n not in idle or n in owner:
                    raise RuntimeError(f"policy {policy.name} placed node {n!r} twice or on a busy node")  # a policy bug, not input
                owner[n] = job_id
        for j in active:
            new = allocation.get(j.spec.id)
            before, after = set(j.nodes), set(new.nodes) if new is not None else set()
            if before == after:
                continue
            if before and after and (after - before) and (before - after):
                raise RuntimeError(f"policy {policy.name} migrated job {j.spec.id!r}")
            if not before:
                counts.starts += 1
                j.stall_until = t + j.cost.up_s
            elif not after:
                counts.stops += 1
            elif len(after) > len(before):
                counts.grows += 1
                lost += j.rate() * j.cost.up_s
                j.stall_until = max(j.stall_until, t + j.cost.up_s)
            else:
                counts.shrinks += 1
                lost += j.rate() * j.cost.down_s
                j.stall_until = max(j.stall_until, t + j.cost.down_s)
            j.share = new
            schedule.append(NodeScheduleRow(t, j.spec.id, len(after), "policy"))

    decide(now)
    while now < t_end:
        t_event = events[ei][0] if ei < len(events) else math.inf
        t_done = min((j.completion_time(now) for j in state), default=math.inf)
        t_next = min(t_event, t_done, t_end)
        for j in state:
            j.advance(now, t_next)
        now = t_next
        if now >= t_end:
            break
        for j in state:
            if j.finished is None and j.nodes and j.done >= j.spec.total_samples - 1e-6:
                j.finished = now
                j.share = None
                schedule.append(NodeScheduleRow(now, j.spec.id, 0, "completed"))
        if t_event <= now:
            counts.events += 1
            for c in events[ei][1]:
                (idle.__setitem__(c.node, None) if c.idle else idle.pop(c.node, None))
            ei += 1
            for j in state:
                if j.share is None:
                    continue
                kept = tuple(n for n in j.share.nodes if n in idle)
                if len(kept) == len(j.share.nodes):
                    continue
                counts.preemptions += 1
                if len(kept) < j.spec.min_gpus:
                    j.share = None
                else:
                    j.share = replace(j.share, gpus=len(kept), nodes=kept)
                    j.stall_until = max(j.stall_until, now + j.cost.down_s)
                schedule.append(NodeScheduleRow(now, j.spec.id, len(kept), "preempted"))
        decide(now)

    node_seconds = idle_integral(trace, t_start, t_end)
    n_eq = node_seconds / (t_end - t_start)
    first = [j for j in state][:max_parallel]
    static = (t_end - t_start) * best_static_rate([j.curve for j in first], n_eq, [(j.spec.min_gpus, j.spec.max_gpus) for j in first])
    samples = sum(j.done for j in state)
    return ReplayResult(
        policy=policy.name,
        start=t_start,
        end=t_end,
        node_seconds=node_seconds,
        n_eq=n_eq,
        samples=samples,
        static_samples=static,
        utilisation=samples / static if static > 0 else 0.0,
        events=counts.events,
        decisions=counts.decisions,
        grows=counts.grows,
        shrinks=counts.shrinks,
        starts=counts.starts,
        stops=counts.stops,
        preemptions=counts.preemptions,
        rescale_loss_samples=lost,
        completed=tuple(j.spec.id for j in state if j.finished is not None),
        solve_s=tuple(solve_s),
        fallbacks=counts.fallbacks,
        schedule=tuple(schedule),
    )
