"""The data of one seed-003 (BFTrainer) re-allocation: idle nodes, trainers, their curves.

A trainer's objective metric O_j(n) is a piecewise-linear curve through measured points
(the paper's Fig. 4 "discretization points"); between points it is linear, outside
[N_min, N_max] the trainer cannot run. ``objective_value`` is the exact value of the
paper's objective (Eqn. 16) for a vector of node counts, so any formulation and any
exhaustive search can be checked against it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def _fail(owner: str, field_name: str, value: object, why: str) -> ValueError:
    return ValueError(f"{owner}.{field_name}={value!r}: {why}")


@dataclass(frozen=True, slots=True)
class ScalingCurve:
    """O(n) at strictly increasing node counts ``nodes`` (>= 1); linear in between."""

    nodes: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(int(n) for n in self.nodes))
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        if not self.nodes:
            raise _fail("ScalingCurve", "nodes", self.nodes, "need at least one point")
        if len(self.nodes) != len(self.values):
            raise _fail("ScalingCurve", "values", self.values, f"has {len(self.values)} values for {len(self.nodes)} node counts")
        if self.nodes[0] < 1 or any(b <= a for a, b in zip(self.nodes, self.nodes[1:])):
            raise _fail("ScalingCurve", "nodes", self.nodes, "must be strictly increasing integers >= 1")
        if any(not math.isfinite(v) or v < 0 for v in self.values):
            raise _fail("ScalingCurve", "values", self.values, "every value must be finite and >= 0")

    def value(self, n: int) -> float:
        """O(n); 0 for n = 0 (the trainer waits). Outside the measured range is an error."""
        if n == 0:
            return 0.0
        if not self.nodes[0] <= n <= self.nodes[-1]:
            raise _fail("ScalingCurve", "n", n, f"outside the measured range [{self.nodes[0]}, {self.nodes[-1]}]")
        return float(np.interp(n, self.nodes, self.values))

    def restricted(self, lo: int, hi: int) -> ScalingCurve:
        """The same curve on [lo, hi] only: end points interpolated, interior points kept."""
        if not (self.nodes[0] <= lo <= hi <= self.nodes[-1]):
            raise _fail("ScalingCurve", "range", (lo, hi), f"not inside [{self.nodes[0]}, {self.nodes[-1]}]")
        inner = [n for n in self.nodes if lo < n < hi]
        pts = [lo, *inner, hi] if hi > lo else [lo]
        return ScalingCurve(tuple(pts), tuple(self.value(n) for n in pts))

    def scaled(self, factor: float) -> ScalingCurve:
        return ScalingCurve(self.nodes, tuple(v * factor for v in self.values))

    @property
    def is_concave(self) -> bool:
        """Slopes non-increasing: then O is the minimum of its segment lines (an LP)."""
        slopes = [(v1 - v0) / (n1 - n0) for n0, n1, v0, v1 in zip(self.nodes, self.nodes[1:], self.values, self.values[1:])]
        return all(b <= a + 1e-12 * max(1.0, abs(a)) for a, b in zip(slopes, slopes[1:]))


@dataclass(frozen=True, slots=True)
class Trainer:
    """One trainer at an event: limits, objective curve, current (surviving) nodes, rescale costs.

    ``current`` are the trainer's nodes that are still idle at this event (C_j = len);
    ``up_s``/``down_s`` are R_up/R_dw, the seconds a rescale stalls the trainer.
    """

    job_id: str
    nmin: int
    nmax: int
    curve: ScalingCurve
    current: tuple[str, ...] = ()
    up_s: float = 0.0
    down_s: float = 0.0

    def __post_init__(self) -> None:
        owner = f"trainer {self.job_id!r}"
        if not isinstance(self.job_id, str) or not self.job_id:
            raise _fail("trainer", "job_id", self.job_id, "must be a non-empty string")
        if not isinstance(self.nmin, int) or self.nmin < 1:
            raise _fail(owner, "nmin", self.nmin, "must be an integer >= 1")
        if not isinstance(self.nmax, int) or self.nmax < self.nmin:
            raise _fail(owner, "nmax", self.nmax, f"must be an integer >= nmin={self.nmin}")
        if not (self.curve.nodes[0] <= self.nmin and self.nmax <= self.curve.nodes[-1]):
            raise _fail(owner, "curve", self.curve.nodes, f"does not cover [{self.nmin}, {self.nmax}] nodes")
        object.__setattr__(self, "current", tuple(self.current))
        if len(set(self.current)) != len(self.current):
            raise _fail(owner, "current", self.current, "a node is listed twice")
        if len(self.current) > self.nmax:
            raise _fail(owner, "current", len(self.current), f"more nodes than nmax={self.nmax}")
        for name in ("up_s", "down_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise _fail(owner, name, v, "must be a finite number >= 0")

    @property
    def c(self) -> int:
        return len(self.current)

    def rate(self, n: int) -> float:
        """O_j(n), 0 where the trainer cannot run (n = 0 or outside [nmin, nmax])."""
        return self.curve.value(n) if self.nmin <= n <= self.nmax else 0.0

    def choices(self, available: int) -> list[int]:
        """S_j = {0, nmin..nmax} capped by the nodes available."""
        return [0, *range(self.nmin, min(self.nmax, available) + 1)]


@dataclass(frozen=True, slots=True)
class Problem:
    """One event's MILP input: the idle set N, the trainers J, the forward-looking time."""

    nodes: tuple[str, ...]
    trainers: tuple[Trainer, ...]
    t_fwd: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "trainers", tuple(self.trainers))
        if len(set(self.nodes)) != len(self.nodes):
            raise _fail("Problem", "nodes", sorted(n for n in set(self.nodes) if self.nodes.count(n) > 1), "node names must be unique")
        if not isinstance(self.t_fwd, (int, float)) or not math.isfinite(self.t_fwd) or self.t_fwd <= 0:
            raise _fail("Problem", "t_fwd", self.t_fwd, "must be a finite number > 0")
        ids = [t.job_id for t in self.trainers]
        if len(set(ids)) != len(ids):
            raise _fail("Problem", "trainers", ids, "trainer ids must be unique")
        idle, owner = set(self.nodes), {}
        for t in self.trainers:
            for n in t.current:
                if n not in idle:
                    raise _fail(f"trainer {t.job_id!r}", "current", n, "is not an idle node at this event")
                if n in owner:
                    raise _fail(f"trainer {t.job_id!r}", "current", n, f"is already held by trainer {owner[n]!r}")
                owner[n] = t.job_id

    def rescale_loss(self, j: int, n: int) -> float:
        """O_j(C_j) * R_j: the progress lost while trainer j rescales from C_j to n (Eqn. 13-16)."""
        t = self.trainers[j]
        if n == t.c:
            return 0.0
        return t.rate(t.c) * (t.up_s if n > t.c else t.down_s)


def objective_value(problem: Problem, counts: Sequence[int]) -> float:
    """Eqn. 16 for node counts N_j: T_fwd * sum O_j(N_j) - sum O_j(C_j) R_j."""
    return sum(problem.t_fwd * t.rate(n) - problem.rescale_loss(j, n) for j, (t, n) in enumerate(zip(problem.trainers, counts)))


def counts_feasible(problem: Problem, counts: Sequence[int]) -> bool:
    if len(counts) != len(problem.trainers) or sum(counts) > len(problem.nodes):
        return False
    return all(n == 0 or t.nmin <= n <= t.nmax for t, n in zip(problem.trainers, counts))


def exhaustive_counts(problem: Problem) -> tuple[tuple[int, ...], float]:
    """Every count vector in S_1 x ... x S_J (small instances only): the reference optimum.

    Ties go to the lexicographically smallest vector.
    """
    best: tuple[tuple[int, ...], float] = ((0,) * len(problem.trainers), objective_value(problem, [0] * len(problem.trainers)))
    total = len(problem.nodes)
    for counts in itertools.product(*(t.choices(total) for t in problem.trainers)):
        if sum(counts) > total:
            continue
        v = objective_value(problem, counts)
        if v > best[1] + 1e-9:
            best = (tuple(counts), v)
    return best


def assign_nodes(problem: Problem, counts: Sequence[int]) -> dict[str, tuple[str, ...]]:
    """Turn node counts into a node map without migration (seed 003 Eqn. 6-10).

    A shrinking trainer keeps a subset of its current nodes (the first ones in its order),
    a growing one keeps all of its nodes and takes free ones in the idle set's order.
    Any count vector with sum <= |N| can be placed this way: the free pool is the idle
    nodes nobody keeps, which is at least the growth asked for.
    """
    if not counts_feasible(problem, counts):
        raise ValueError(f"counts={tuple(counts)!r}: infeasible for this event (limits or more than {len(problem.nodes)} nodes)")
    kept: dict[str, list[str]] = {}
    for t, n in zip(problem.trainers, counts):
        kept[t.job_id] = list(t.current[: min(n, t.c)])
    taken = {node for nodes in kept.values() for node in nodes}
    free = iter(node for node in problem.nodes if node not in taken)
    for t, n in zip(problem.trainers, counts):
        while len(kept[t.job_id]) < n:
            kept[t.job_id].append(next(free))
    return {job: tuple(nodes) for job, nodes in kept.items() if nodes}


def check_assignment(problem: Problem, assignment: dict[str, tuple[str, ...]]) -> None:
    """Raise ValueError unless: each node serves <= 1 trainer, limits hold, no trainer migrates."""
    idle, seen = set(problem.nodes), {}
    by_id = {t.job_id: t for t in problem.trainers}
    for job, nodes in assignment.items():
        if job not in by_id:
            raise _fail("assignment", "job", job, "is not a trainer of this event")
        t = by_id[job]
        if nodes and not t.nmin <= len(nodes) <= t.nmax:
            raise _fail(f"assignment[{job}]", "nodes", len(nodes), f"outside [{t.nmin}, {t.nmax}]")
        for n in nodes:
            if n not in idle:
                raise _fail(f"assignment[{job}]", "nodes", n, "is not idle")
            if n in seen:
                raise _fail(f"assignment[{job}]", "nodes", n, f"also serves {seen[n]!r}")
            seen[n] = job
        cur, new = set(t.current), set(nodes)
        if (new - cur) and (cur - new):
            raise _fail(f"assignment[{job}]", "nodes", sorted(new ^ cur), "adds and removes nodes at once (migration)")
