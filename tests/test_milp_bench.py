"""benchmarks/milp_bench.py's agreement count (issue 16, defect 4): solves that did not prove
optimality were dropped from ``same_optimum`` without a word; now they are counted by reason."""

from allocator.policies.idle_nodes_milp import Decision, SolveStatus
from benchmarks.milp_bench import Agreement


def _d(objective: float, status: SolveStatus = SolveStatus.OPTIMAL) -> Decision:
    return Decision({}, objective, status, status is not SolveStatus.OPTIMAL, status.value, 0.0, 0.0)


def test_agreement_counts_compared_mismatched_and_left_out_with_reasons() -> None:
    a = Agreement()
    a.add(_d(10.0), _d(10.0 + 1e-9), ("count", "node"))
    a.add(_d(10.0), _d(9.0), ("count", "node"))
    a.add(_d(10.0), _d(8.0, SolveStatus.TIME_LIMIT_FEASIBLE), ("count", "node"))
    a.add(_d(10.0), _d(8.0, SolveStatus.TIME_LIMIT_FEASIBLE), ("count", "node"))
    a.add(_d(0.0, SolveStatus.ERROR), _d(1.0), ("count", "node"))
    assert a.figures("x") == {
        "x_compared": 2,
        "x_mismatches": 1,
        "x_left_out": {"count error": 1, "node time_limit_feasible": 2},
    }
