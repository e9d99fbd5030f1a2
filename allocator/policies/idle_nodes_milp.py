"""Seed 003 (BFTrainer): the idle-node MILP policy — build (``allocator/idle_nodes/milp_model.py``:
the paper's node formulation and our exact count formulation), solve with HiGHS, extract.

Safety (Sec. 3.6): the solver's model status and primal-solution status are read, not
just the objective. On a time-out with a solution we keep the better of it and the
current map; on a time-out without one, infeasibility or an error we keep the current
map (trainers below N_min after preemption get zero) and say why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import pulp

from allocator.idle_nodes.milp_model import BuiltModel, Formulation, PwlMode, build, build_count_model, build_node_model
from allocator.idle_nodes.model import (
    Problem,
    ScalingCurve,
    assign_nodes,
    check_assignment,
    counts_feasible,
    objective_value,
)
from allocator.idle_nodes.snapshot_io import (
    ObjectiveKind,
    NodeRescaleCost,
    allocation_from_assignment,
    problem_from_snapshot,
)
from allocator.policies.base import register
from allocator.types import Allocation, ClusterSnapshot

__all__ = [
    "BuiltModel", "Decision", "Formulation", "IdleNodesMilp", "PwlMode", "SolveResult", "SolveStatus",
    "build", "build_count_model", "build_node_model", "decide", "extract", "extract_counts", "keep_current", "solve", "solve_counts",
]


class SolveStatus(str, Enum):
    OPTIMAL = "optimal"
    TIME_LIMIT_FEASIBLE = "time_limit_feasible"
    TIME_LIMIT_NO_SOLUTION = "time_limit_no_solution"
    INFEASIBLE = "infeasible"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class SolveResult:
    status: SolveStatus
    objective: float | None
    solve_s: float
    message: str


@dataclass(frozen=True, slots=True)
class Decision:
    """What one event's solve decided and why: the node map, its objective, the solver's word."""

    assignment: Mapping[str, tuple[str, ...]]
    objective: float
    status: SolveStatus
    kept_previous: bool
    reason: str
    build_s: float
    solve_s: float

    @property
    def counts(self) -> dict[str, int]:
        return {job: len(nodes) for job, nodes in self.assignment.items()}


# ---------------------------------------------------------------- solve


def solve(built: BuiltModel, time_limit_s: float, mip_gap: float = 1e-6, threads: int = 1) -> SolveResult:
    """Run HiGHS in-process and classify the outcome from its model and primal-solution status."""
    if not (isinstance(time_limit_s, (int, float)) and math.isfinite(time_limit_s) and time_limit_s > 0):
        raise ValueError(f"time_limit_s={time_limit_s!r}: must be a finite number > 0")
    solver = pulp.HiGHS(msg=False, timeLimit=float(time_limit_s), gapRel=mip_gap, threads=threads)
    start = time.perf_counter()
    try:
        built.lp.solve(solver)
    except Exception as exc:  # a solver crash must not take the scheduler down
        return SolveResult(SolveStatus.ERROR, None, time.perf_counter() - start, f"solver error: {exc}")
    elapsed = time.perf_counter() - start
    import highspy  # pulp.HiGHS needs it, so it is importable here

    highs = built.lp.solverModel
    model_status = highs.getModelStatus()
    has_solution = highs.getInfo().primal_solution_status == 2  # kSolutionStatusFeasible
    ms = highspy.HighsModelStatus
    if model_status == ms.kOptimal and has_solution:
        return SolveResult(SolveStatus.OPTIMAL, float(pulp.value(built.lp.objective)), elapsed, "optimal")
    if model_status in (ms.kTimeLimit, ms.kIterationLimit, ms.kInterrupt):
        if has_solution:
            return SolveResult(
                SolveStatus.TIME_LIMIT_FEASIBLE, float(pulp.value(built.lp.objective)), elapsed, f"time limit {time_limit_s}s hit with a feasible solution"
            )
        return SolveResult(SolveStatus.TIME_LIMIT_NO_SOLUTION, None, elapsed, f"time limit {time_limit_s}s hit before any feasible solution")
    if model_status in (ms.kInfeasible, ms.kUnboundedOrInfeasible):
        return SolveResult(SolveStatus.INFEASIBLE, None, elapsed, "model infeasible")
    return SolveResult(SolveStatus.ERROR, None, elapsed, f"solver status {highs.modelStatusToString(model_status)} (pulp status {pulp.LpStatus[built.lp.status]}, sol_status {built.lp.sol_status})")


# ---------------------------------------------------------------- extract


def extract_counts(built: BuiltModel) -> tuple[int, ...]:
    return tuple(int(round(pulp.value(c) or 0.0)) for c in built.counts)


def extract(built: BuiltModel) -> dict[str, tuple[str, ...]]:
    """The node map: read x_jn (node form) or place the counts without migration (count form)."""
    problem = built.problem
    if built.formulation is Formulation.COUNT:
        return assign_nodes(problem, extract_counts(built))
    out = {}
    for t, xs in zip(problem.trainers, built.x):
        nodes = tuple(n for n in problem.nodes if (xs[n].varValue or 0.0) > 0.5)
        if nodes:
            out[t.job_id] = nodes
    return out


def keep_current(problem: Problem) -> tuple[dict[str, tuple[str, ...]], tuple[int, ...]]:
    """The current map made valid: a trainer left below its N_min by preemption gets zero."""
    counts = tuple(t.c if t.c >= t.nmin else 0 for t in problem.trainers)
    return assign_nodes(problem, counts), counts


def decide(
    problem: Problem,
    formulation: Formulation = Formulation.COUNT,
    time_limit_s: float = 10.0,
    pwl: PwlMode = PwlMode.HULL,
    mip_gap: float = 1e-6,
    must_run: frozenset[str] = frozenset(),
) -> Decision:
    """Build, solve, extract; fall back to the current map whenever the answer is not usable."""
    fallback, fallback_counts = keep_current(problem)
    fallback_value = objective_value(problem, fallback_counts)
    if not problem.trainers:
        return Decision({}, 0.0, SolveStatus.OPTIMAL, False, "no trainers", 0.0, 0.0)
    t0 = time.perf_counter()
    built = build(problem, formulation, pwl, frozenset(must_run))
    build_s = time.perf_counter() - t0
    result = solve(built, time_limit_s, mip_gap)
    if result.status in (SolveStatus.OPTIMAL, SolveStatus.TIME_LIMIT_FEASIBLE):
        try:
            assignment = extract(built)
            check_assignment(problem, assignment)
            counts = tuple(len(assignment.get(t.job_id, ())) for t in problem.trainers)
            if not counts_feasible(problem, counts):
                raise ValueError(f"counts={counts}: violate the trainers' limits")
        except (ValueError, StopIteration, TypeError) as exc:
            return Decision(fallback, fallback_value, SolveStatus.ERROR, True, f"solver answer unusable ({exc}); kept the current map", build_s, result.solve_s)
        value = objective_value(problem, counts)
        if result.status is SolveStatus.TIME_LIMIT_FEASIBLE and fallback_value > value:
            return Decision(fallback, fallback_value, result.status, True, f"{result.message}; the current map is better, kept it", build_s, result.solve_s)
        return Decision(assignment, value, result.status, False, result.message, build_s, result.solve_s)
    return Decision(fallback, fallback_value, result.status, True, f"{result.message}; kept the current map", build_s, result.solve_s)


# ---------------------------------------------------------------- policy


@dataclass(slots=True)
class IdleNodesMilp:
    """The Policy: snapshot (with ``nodes``) -> Problem -> Decision -> Allocation with node lists.

    ``last`` holds the latest Decision so a caller (the replay, the CLI) can report the
    solver status and solve time; the allocation itself never depends on it.
    """

    t_fwd: float = 120.0
    formulation: Formulation = Formulation.COUNT
    objective: ObjectiveKind = ObjectiveKind.THROUGHPUT
    time_limit_s: float = 10.0
    pwl: PwlMode = PwlMode.HULL
    mip_gap: float = 1e-6
    default_cost: NodeRescaleCost | None = None  # None: the run's (the replay fills it in), else none
    costs: Mapping[str, NodeRescaleCost] = field(default_factory=dict)
    curves: Mapping[str, ScalingCurve] = field(default_factory=dict)
    name: str = "idle_nodes_milp"
    last: Decision | None = None

    def decide(self, snapshot: ClusterSnapshot) -> tuple[Problem, Decision]:
        problem = problem_from_snapshot(snapshot, self.t_fwd, self.objective, self.default_cost or NodeRescaleCost(), self.costs, self.curves)
        decision = decide(problem, self.formulation, self.time_limit_s, self.pwl, self.mip_gap)
        self.last = decision
        return problem, decision

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        _, decision = self.decide(snapshot)
        return allocation_from_assignment(snapshot, decision.assignment)


def _enum(kind: type[Enum], field_name: str, value: object) -> Enum:
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{field_name}={value!r}: choose one of {', '.join(k.value for k in kind)}") from None


@register("idle_nodes_milp")
def make_idle_nodes_milp(
    t_fwd: float = 120.0,
    formulation: str = "count",
    objective: str = "throughput",
    time_limit_s: float = 10.0,
    pwl: str = "hull",
    mip_gap: float = 1e-6,
    up_s: float | None = None,
    down_s: float | None = None,
    costs: Mapping[str, NodeRescaleCost] | None = None,
    curves: Mapping[str, ScalingCurve] | None = None,
) -> IdleNodesMilp:
    if not (isinstance(time_limit_s, (int, float)) and math.isfinite(time_limit_s) and time_limit_s > 0):
        raise ValueError(f"time_limit_s={time_limit_s!r}: must be a finite number > 0")
    if not (isinstance(t_fwd, (int, float)) and math.isfinite(t_fwd) and t_fwd > 0):
        raise ValueError(f"t_fwd={t_fwd!r}: must be a finite number > 0")
    return IdleNodesMilp(
        t_fwd=float(t_fwd),
        formulation=_enum(Formulation, "formulation", formulation),
        objective=_enum(ObjectiveKind, "objective", objective),
        time_limit_s=float(time_limit_s),
        pwl=_enum(PwlMode, "pwl", pwl),
        mip_gap=mip_gap,
        default_cost=None if up_s is None and down_s is None else NodeRescaleCost(up_s or 0.0, down_s or 0.0),
        costs=dict(costs or {}),
        curves=dict(curves or {}),
    )


def solve_counts(problem: Problem, formulation: Formulation, time_limit_s: float = 60.0, pwl: PwlMode = PwlMode.HULL) -> tuple[Sequence[int], SolveResult]:
    """Counts and raw solver result, for tests and benchmarks that compare formulations."""
    built = build(problem, formulation, pwl)
    result = solve(built, time_limit_s)
    counts = extract_counts(built) if result.objective is not None else ()
    return counts, result
