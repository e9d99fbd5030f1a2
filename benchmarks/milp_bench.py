"""Seed 003 MILP solve times (paper Sec. 3.6, Fig. 5): random events on Table 2 trainers.

Each event: a random valid node map over the previous idle set (every trainer within
[N_min, N_max] or waiting), then up to 10 % of the nodes leave (preempting whoever held
them) and new nodes join so |N| is the size asked for. T_fwd = 120 s (where the paper's
U saturates, Fig. 9); R_up = 20 s (the paper's Sec. 2.1 example), R_dw = 5 s (our
assumption: "usually smaller"). Times are build + HiGHS solve, one thread, wall clock.

    .venv/bin/python benchmarks/milp_bench.py [--events 10]
Last line: one JSON object. "Same optimum" is counts: ``node_vs_count_compared`` (events where
both forms proved optimality), ``node_vs_count_mismatches``, and ``node_vs_count_left_out``
(why the rest were not compared, by form and solver status); likewise ``bigm_vs_hull_*``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from allocator.idle_nodes.model import Problem, Trainer
from allocator.idle_nodes.table2 import TABLE2
from allocator.policies.idle_nodes_milp import Decision, Formulation, PwlMode, SolveStatus, decide

NAMES = sorted(TABLE2)


def random_event(rng: np.random.Generator, n_nodes: int, n_jobs: int) -> Problem:
    before = [f"p{i}" for i in range(n_nodes)]
    order = rng.permutation(n_nodes)
    held: list[tuple[str, ...]] = []
    start = 0
    for _ in range(n_jobs):
        want = int(rng.integers(0, min(64, 2 * n_nodes // n_jobs) + 1))
        want = min(want, n_nodes - start)
        held.append(tuple(before[i] for i in order[start : start + want]))
        start += want
    leaving = set(rng.choice(before, size=int(rng.integers(0, n_nodes // 10 + 1)), replace=False).tolist())
    stay = [n for n in before if n not in leaving]
    nodes = tuple(stay + [f"q{i}" for i in range(n_nodes - len(stay))])
    trainers = tuple(
        Trainer(f"j{j}", 1, 64, TABLE2[NAMES[j % len(NAMES)]], tuple(n for n in held[j] if n not in leaving), 20.0, 5.0)
        for j in range(n_jobs)
    )
    return Problem(nodes, trainers, 120.0)


@dataclass
class Agreement:
    """Two solves of the same events: how many were compared, how many optima differed, and
    why the others were left out (a solve that did not prove optimality has no optimum to
    compare; it is counted by side and status, never dropped silently)."""

    compared: int = 0
    mismatches: int = 0
    left_out: Counter = field(default_factory=Counter)

    def add(self, a: Decision, b: Decision, names: tuple[str, str]) -> None:
        bad = [f"{n} {d.status.value}" for n, d in zip(names, (a, b)) if d.status is not SolveStatus.OPTIMAL]
        if bad:
            self.left_out[", ".join(bad)] += 1
            return
        self.compared += 1
        self.mismatches += abs(a.objective - b.objective) > 1e-6 * max(1.0, abs(a.objective))

    def figures(self, prefix: str) -> dict[str, object]:
        return {f"{prefix}_compared": self.compared, f"{prefix}_mismatches": self.mismatches, f"{prefix}_left_out": dict(sorted(self.left_out.items()))}


def timed(problem: Problem, formulation: Formulation, limit: float, pwl: PwlMode = PwlMode.HULL):
    t0 = time.perf_counter()
    d = decide(problem, formulation, time_limit_s=limit, pwl=pwl)
    return time.perf_counter() - t0, d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10)
    ap.add_argument("--node-events", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    events = [random_event(rng, 800, 30) for _ in range(args.events)]
    count_times, count_decisions = [], []
    for p in events:
        s, d = timed(p, Formulation.COUNT, 10.0)
        count_times.append(s)
        count_decisions.append(d)
    paper_times, bigm = [], Agreement()
    for p, c in zip(events, count_decisions):
        s, d = timed(p, Formulation.COUNT, 10.0, PwlMode.AUTO)
        paper_times.append(s)
        bigm.add(c, d, ("hull", "big-M"))
    print(f"800x30 count, paper's big-M Eqn. 15 + concave/segment curve: median {statistics.median(paper_times):.4f}s")
    print(f"800x30 count: median {statistics.median(count_times):.4f}s max {max(count_times):.4f}s over {len(events)} events")
    node_times, same = [], Agreement()
    for p, c in zip(events[: args.node_events], count_decisions):
        s, d = timed(p, Formulation.NODE, 120.0)
        node_times.append(s)
        same.add(c, d, ("count", "node"))
        print(f"800x30 node: {s:.3f}s status {d.status.value} objective {d.objective:.1f} vs count {c.objective:.1f}")
    # medium instances where the node form finishes comfortably
    for _ in range(5):
        p = random_event(rng, 120, 8)
        _, c = timed(p, Formulation.COUNT, 30.0)
        _, n = timed(p, Formulation.NODE, 60.0)
        same.add(c, n, ("count", "node"))
    print(f"node vs count: {same.mismatches} mismatches over {same.compared} compared; left out: {dict(same.left_out) or 'none'}")
    big = random_event(rng, 4000, 200)
    big_s, big_d = timed(big, Formulation.COUNT, 60.0)
    print(f"4000x200 count: {big_s:.3f}s status {big_d.status.value}")
    print(
        json.dumps(
            {
                "milp_800x30_median_s": round(statistics.median(count_times), 4),
                "milp_800x30_max_s": round(max(count_times), 4),
                "milp_800x30_bigm_count_s": round(statistics.median(paper_times), 4),
                "milp_800x30_node_form_s": round(statistics.median(node_times), 3) if node_times else None,
                "node_over_count_ratio": round(statistics.median(node_times) / statistics.median(count_times), 1) if node_times else None,
                "milp_4000x200_s": round(big_s, 3),
                "milp_4000x200_status": big_d.status.value,
                "count_800x30_optimal": sum(d.status is SolveStatus.OPTIMAL for d in count_decisions),
                **same.figures("node_vs_count"),
                **bigm.figures("bigm_vs_hull"),
                "events": len(events),
            }
        )
    )


if __name__ == "__main__":
    main()
