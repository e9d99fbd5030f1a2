"""Seed 003 idle-node MILP: exhaustive-search equality, formulation agreement, invariants, safety."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from allocator.idle_nodes.model import (
    Problem,
    ScalingCurve,
    Trainer,
    assign_nodes,
    check_assignment,
    exhaustive_counts,
    objective_value,
)
from allocator.policies import make_policy
from allocator.policies.idle_nodes_milp import (
    Formulation,
    PwlMode,
    SolveStatus,
    build,
    decide,
    keep_current,
    solve,
)
from allocator.types import ClusterSnapshot, InfeasibleError, RunningJob, Share
from tests.factories import make_job, make_profile


def random_curve(rng: np.random.Generator, top: int) -> ScalingCurve:
    """Increasing, sometimes convex, sometimes concave: exercises both PWL models."""
    pts = sorted({1, top, *rng.integers(1, top + 1, size=2).tolist()})
    steps = rng.uniform(0.2, 3.0, size=len(pts))
    return ScalingCurve(tuple(pts), tuple(np.cumsum(steps * np.array(pts) / np.maximum(1, np.array(pts) - 0.5))))


def random_problem(rng: np.random.Generator, n_nodes: int, n_jobs: int, top: int | None = None) -> Problem:
    nodes = tuple(f"n{i}" for i in range(n_nodes))
    order = list(rng.permutation(n_nodes))
    trainers = []
    for j in range(n_jobs):
        cap = top or n_nodes
        nmin = int(rng.integers(1, max(2, cap // 2)))
        nmax = int(rng.integers(nmin, cap + 1))
        held = int(rng.integers(0, nmax + 1))
        held = min(held, len(order))
        current = tuple(nodes[i] for i in order[:held])
        order = order[held:]
        trainers.append(
            Trainer(f"j{j}", nmin, nmax, random_curve(rng, cap), current, float(rng.uniform(0, 60)), float(rng.uniform(0, 20)))
        )
    return Problem(nodes, tuple(trainers), float(rng.uniform(5, 300)))


def exhaustive_nodes(problem: Problem) -> float:
    """Every node -> (nobody | trainer j) map that honours the paper's constraints directly."""
    best = -np.inf
    ids = [t.job_id for t in problem.trainers]
    for owners in itertools.product([None, *ids], repeat=len(problem.nodes)):
        assignment = {j: tuple(n for n, o in zip(problem.nodes, owners) if o == j) for j in ids}
        try:
            check_assignment(problem, {j: a for j, a in assignment.items() if a})
        except ValueError:
            continue
        best = max(best, objective_value(problem, [len(assignment[j]) for j in ids]))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_both_formulations_equal_exhaustive_search_on_small_instances(seed: int) -> None:
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, int(rng.integers(1, 7)), int(rng.integers(1, 4)))
    _, best = exhaustive_counts(problem)
    for formulation in Formulation:
        for pwl in PwlMode:
            d = decide(problem, formulation, time_limit_s=30, pwl=pwl)
            assert d.status is SolveStatus.OPTIMAL, d.reason
            assert d.objective == pytest.approx(best, rel=1e-6, abs=1e-6), (formulation, pwl)
            check_assignment(problem, dict(d.assignment))


@pytest.mark.parametrize("seed", range(3))
def test_count_search_equals_node_level_search(seed: int) -> None:
    # the count formulation's premise: the node-level optimum depends on counts only
    rng = np.random.default_rng(100 + seed)
    problem = random_problem(rng, 5, 3)
    assert exhaustive_nodes(problem) == pytest.approx(exhaustive_counts(problem)[1])


@pytest.mark.parametrize("seed", range(3))
def test_node_and_count_formulations_agree_on_medium_instances(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    problem = random_problem(rng, 40, 6, top=16)
    count = decide(problem, Formulation.COUNT, time_limit_s=60)
    node = decide(problem, Formulation.NODE, time_limit_s=60)
    assert count.status is SolveStatus.OPTIMAL and node.status is SolveStatus.OPTIMAL
    assert count.objective == pytest.approx(node.objective, rel=1e-6)


def test_invariants_and_below_minimum_trainers_get_zero() -> None:
    curve = ScalingCurve((1, 2, 4, 8), (1.0, 1.9, 3.6, 6.0))
    nodes = tuple(f"n{i}" for i in range(10))
    trainers = (
        Trainer("a", 4, 8, curve, ("n0", "n1"), 10, 5),  # preempted below its N_min of 4
        Trainer("b", 2, 3, curve, ("n2", "n3", "n4"), 10, 5),
        Trainer("c", 6, 8, curve, (), 10, 5),
    )
    problem = Problem(nodes, trainers, 60.0)
    for formulation in Formulation:
        d = decide(problem, formulation)
        check_assignment(problem, dict(d.assignment))
        for t in trainers:
            n = len(d.assignment.get(t.job_id, ()))
            assert n == 0 or t.nmin <= n <= t.nmax
            if 0 < n and t.current:
                kept = set(t.current) & set(d.assignment[t.job_id])
                assert kept == set(t.current) or set(d.assignment[t.job_id]) <= set(t.current)
        assert sum(d.counts.values()) <= len(nodes)
    # keeping the current map drops the trainer left below its minimum
    fallback, counts = keep_current(problem)
    assert counts == (0, 3, 0) and "a" not in fallback


def test_no_migration_growth_keeps_every_current_node() -> None:
    curve = ScalingCurve((1, 8), (1.0, 8.0))
    nodes = tuple(f"n{i}" for i in range(8))
    problem = Problem(nodes, (Trainer("a", 1, 8, curve, ("n5", "n6"), 1, 1),), 1000.0)
    for formulation in Formulation:
        d = decide(problem, formulation)
        assert len(d.assignment["a"]) == 8 and {"n5", "n6"} <= set(d.assignment["a"])


def test_assign_nodes_rejects_counts_that_do_not_fit() -> None:
    curve = ScalingCurve((1, 4), (1.0, 4.0))
    problem = Problem(("n0", "n1"), (Trainer("a", 1, 4, curve),), 10.0)
    with pytest.raises(ValueError, match="counts"):
        assign_nodes(problem, [3])


def test_rescale_cost_keeps_a_short_horizon_from_rescaling() -> None:
    # growing by one node gains T_fwd * 1 sample; losing 10 s at the current 4 samples/s costs 40
    curve = ScalingCurve((1, 8), (1.0, 8.0))
    nodes = tuple(f"n{i}" for i in range(8))
    problem_short = Problem(nodes[:5], (Trainer("a", 1, 8, curve, nodes[:4], 10, 10),), 20.0)
    problem_long = Problem(nodes[:5], (Trainer("a", 1, 8, curve, nodes[:4], 10, 10),), 100.0)
    assert decide(problem_short).counts == {"a": 4}
    assert decide(problem_long).counts == {"a": 5}


def big_problem(n_nodes: int, n_jobs: int) -> Problem:
    rng = np.random.default_rng(7)
    return random_problem(rng, n_nodes, n_jobs, top=64)


def test_forced_time_out_keeps_the_current_map() -> None:
    problem = big_problem(600, 25)
    d = decide(problem, Formulation.NODE, time_limit_s=1e-3)
    assert d.status in (SolveStatus.TIME_LIMIT_NO_SOLUTION, SolveStatus.TIME_LIMIT_FEASIBLE)
    check_assignment(problem, dict(d.assignment))
    if d.status is SolveStatus.TIME_LIMIT_NO_SOLUTION:
        assert d.kept_previous and dict(d.assignment) == keep_current(problem)[0]
        assert "kept the current map" in d.reason
    else:  # a solution in time: the better of it and the current map, never worse
        assert d.objective >= objective_value(problem, keep_current(problem)[1]) - 1e-9


def test_infeasible_request_is_reported_and_keeps_the_current_map() -> None:
    curve = ScalingCurve((1, 4), (1.0, 4.0))
    trainers = tuple(Trainer(f"j{i}", 2, 4, curve) for i in range(3))
    problem = Problem(("n0", "n1", "n2"), trainers, 60.0)
    d = decide(problem, must_run=frozenset({"j0", "j1"}))
    assert d.status is SolveStatus.INFEASIBLE and d.kept_previous and dict(d.assignment) == {}
    assert "infeasible" in d.reason
    with pytest.raises(ValueError, match="must_run"):
        decide(problem, must_run=frozenset({"nobody"}))


def test_solve_reports_infeasible_status_from_highs() -> None:
    curve = ScalingCurve((1, 4), (1.0, 4.0))
    problem = Problem(("n0",), (Trainer("a", 2, 4, curve),), 60.0)
    built = build(problem, must_run=frozenset({"a"}))
    assert solve(built, 5.0).status is SolveStatus.INFEASIBLE


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(time_limit_s=0), "time_limit_s"),
        (dict(formulation="exact"), "formulation"),
        (dict(objective="speed"), "objective"),
        (dict(t_fwd=-1), "t_fwd"),
        (dict(up_s=-2.0), "up_s"),
    ],
)
def test_bad_policy_settings_name_the_field(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_policy("idle_nodes_milp", **bad)


def test_problem_validation_names_the_field() -> None:
    curve = ScalingCurve((1, 4), (1.0, 4.0))
    with pytest.raises(ValueError, match="current"):
        Problem(("n0",), (Trainer("a", 1, 4, curve, ("n9",)),), 10.0)
    with pytest.raises(ValueError, match="curve"):
        Trainer("a", 1, 8, curve)
    with pytest.raises(ValueError, match="nodes"):
        ScalingCurve((2, 1), (1.0, 2.0))


def test_policy_on_a_snapshot_returns_node_placed_shares() -> None:
    job_a = make_job("a", max_gpus=8)
    job_b = make_job("b", max_gpus=8)
    nodes = tuple((f"n{i}", 1) for i in range(6))
    running = (RunningJob(job_a, Share(gpus=2, global_batch=max(2, job_a.min_batch), nodes=("n0", "n7")), 0.0),)
    # n7 left the idle set: job a was preempted down to n0 only
    snapshot = ClusterSnapshot(time=5.0, capacity=6, running=running, queued=(job_b,), nodes=nodes)
    for objective in ("throughput", "scaling_efficiency"):
        policy = make_policy("idle_nodes_milp", objective=objective, t_fwd=120.0, up_s=5.0, down_s=1.0)
        allocation = policy.allocate(snapshot)
        used = [n for _, s in allocation.shares for n in s.nodes]
        assert len(used) == len(set(used)) and set(used) <= {n for n, _ in nodes}
        # Six idle nodes, two jobs of one curve: both run, and a keeps the node it still holds
        # (no migration: a running trainer's nodes stay unless it shrinks off them).
        assert {job for job, _ in allocation.shares} == {"a", "b"}
        assert "n0" in allocation["a"].nodes
        for _, share in allocation.shares:
            assert share.gpus == len(share.nodes)


def _feasible_gpus(job) -> set[int]:
    """GPU counts where some global batch in [min_batch, max_batch] puts 1..cap samples on every GPU."""
    cap = job.profile.max_batch_per_gpu
    return {k for k in range(job.min_gpus, job.max_gpus + 1) if any(k <= b <= k * cap for b in range(job.min_batch, job.max_batch + 1))}


@pytest.mark.parametrize("name", ["idle_nodes_milp", "idle_nodes_greedy", "idle_nodes_fifo"])
def test_jobs_that_cannot_run_at_their_limits_get_a_count_that_fits(name: str) -> None:
    # Issue 16, defect 2: without curves these raised ValueError for valid jobs: "a" cannot run
    # on 1 GPU (batch >= 16, 8 per GPU), "b" cannot run on 8 (batch <= 4).
    a = make_job("a", min_batch=16, max_batch=64, max_gpus=8, profile=make_profile(cap=8))
    b = make_job("b", min_batch=1, max_batch=4, max_gpus=8)
    assert min(_feasible_gpus(a)) == 2 and max(_feasible_gpus(b)) == 4
    nodes = tuple((f"n{i}", 1) for i in range(6))
    for queued in ((a, b), (b, a)):
        allocation = make_policy(name).allocate(ClusterSnapshot(time=0.0, capacity=6, queued=queued, nodes=nodes))
        assert allocation.shares, "nothing placed although both jobs fit"
        for job_id, share in allocation.shares:
            job = {"a": a, "b": b}[job_id]
            assert share.gpus in _feasible_gpus(job) and share.gpus == len(share.nodes)
            assert share.gpus <= share.global_batch <= share.gpus * job.profile.max_batch_per_gpu
            assert job.min_batch <= share.global_batch <= job.max_batch


@pytest.mark.parametrize("name", ["idle_nodes_milp", "idle_nodes_greedy", "idle_nodes_fifo"])
def test_a_job_that_fits_no_node_count_is_infeasible_not_a_value_error(name: str) -> None:
    stuck = make_job("s", min_batch=16, max_batch=64, max_gpus=1, profile=make_profile(cap=8))
    assert not _feasible_gpus(stuck)
    nodes = tuple((f"n{i}", 1) for i in range(4))
    with pytest.raises(InfeasibleError, match="'s'"):
        make_policy(name).allocate(ClusterSnapshot(time=0.0, capacity=4, queued=(stuck,), nodes=nodes))
