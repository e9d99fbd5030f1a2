"""Replaying an idle-node trace (seed 003, BFTrainer) under several policies and printing the result:
what ``malleable idle-nodes`` and ``malleable simulate -p idle_nodes_*`` both run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.table import Table

from allocator.idle_nodes.replay import ReplayResult, replay, trainer_spec
from allocator.idle_nodes.snapshot_io import NodeRescaleCost
from allocator.idle_nodes.table2 import TABLE2
from allocator.idle_nodes.trace import generate_trace, load_trace, trace_stats, write_trace
from allocator.policies import UnknownPolicyError, make_policy
from flows.commands.shared.console import console, fail
from flows.config.paths import check_output_file

IDLE_POLICIES = ("idle_nodes_milp", "idle_nodes_greedy", "idle_nodes_fifo")


def result_row(r: ReplayResult) -> dict[str, object]:
    return {
        "policy": r.policy,
        "utilisation": round(r.utilisation, 4),
        "throughput_samples_s": round(r.throughput, 1),
        "n_eq": round(r.n_eq, 2),
        "grows": r.grows,
        "shrinks": r.shrinks,
        "starts": r.starts,
        "stops": r.stops,
        "preemptions": r.preemptions,
        "decisions": r.decisions,
        "median_solve_s": round(r.median_solve_s, 5),
        "max_solve_s": round(r.max_solve_s, 4),
        "fallbacks": r.fallbacks,
        "completed": len(r.completed),
    }


def replay_idle_nodes(
    trace: Path | None = None,
    policy: list[str] | None = None,
    nodes: int = 1024,
    hours: float = 6.0,
    seed: int = 0,
    trainers: int = 10,
    workload: str = "hpo",
    t_fwd: float = 120.0,
    up_s: float = 20.0,
    down_s: float = 5.0,
    objective: str = "throughput",
    formulation: str = "count",
    time_limit: float = 10.0,
    save_trace: Path | None = None,
    as_json: bool = False,
) -> None:
    """Replay idle nodes under each policy and report U = A_e / A_s, throughput, rescales and solve times."""
    try:
        if workload not in ("hpo", "diverse"):
            raise ValueError(f"--workload={workload!r}: choose hpo or diverse")
        if trainers < 1:
            raise ValueError(f"--trainers={trainers}: must be >= 1")
        for name in policy or IDLE_POLICIES:
            if name not in IDLE_POLICIES:
                raise ValueError(f"--policy={name!r}: idle-node replay runs {', '.join(IDLE_POLICIES)}")
        if save_trace is not None:
            check_output_file(save_trace, "--save-trace")
        if trace is not None:
            idle = load_trace(trace)
        else:
            if nodes < 1 or hours <= 0:
                raise ValueError(f"nodes={nodes}, hours={hours}: need nodes >= 1 and hours > 0")
            idle = generate_trace(np.random.default_rng(seed), nodes=nodes, hours=hours)
        if not idle.changes:
            raise ValueError("trace: no node changes to replay")
        if save_trace is not None:
            try:
                write_trace(idle, save_trace)
            except OSError as exc:
                raise ValueError(f"--save-trace={str(save_trace)!r}: cannot write ({exc.strerror})") from None
        names = sorted(TABLE2) if workload == "diverse" else ["shufflenet"]
        jobs = [trainer_spec(f"t{i:03d}", names[i % len(names)], TABLE2[names[i % len(names)]], 10**13) for i in range(trainers)]
        cost = NodeRescaleCost(up_s, down_s)
        results = []
        for name in policy or IDLE_POLICIES:
            params: dict[str, object] = dict(curves=TABLE2)
            if name == "idle_nodes_milp":
                params.update(t_fwd=t_fwd, up_s=up_s, down_s=down_s, objective=objective, formulation=formulation, time_limit_s=time_limit)
            with console.status(f"replaying {len(idle.events())} events under {name}"):
                results.append(replay(idle, jobs, make_policy(name, **params), TABLE2, default_cost=cost, max_parallel=trainers))
    except (ValueError, UnknownPolicyError) as exc:
        fail(str(exc))
    stats = trace_stats(idle)
    if as_json:
        console.print_json(json.dumps({"trace": {k: getattr(stats, k) for k in stats.__slots__}, "results": [result_row(r) for r in results]}))
        return
    console.print(
        f"trace: {stats.hours:.1f} h, {stats.join_events_per_hour:.1f} join / {stats.leave_events_per_hour:.1f} leave events per hour, "
        f"{stats.mean_idle_nodes:.1f} idle nodes on average, {stats.frac_fragments_under_10min:.0%} of fragments < 10 min"
    )
    table = Table(title=f"idle-node replay: {trainers} {workload} trainers, T_fwd={t_fwd:g}s, R_up={up_s:g}s, R_dw={down_s:g}s")
    for col in ("policy", "U", "samples/s", "grow", "shrink", "start", "stop", "preempt", "solve med", "solve max", "kept"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        table.add_row(
            r.policy, f"{r.utilisation:.1%}", f"{r.throughput:,.0f}", str(r.grows), str(r.shrinks), str(r.starts), str(r.stops),
            str(r.preemptions), f"{r.median_solve_s * 1000:.1f} ms", f"{r.max_solve_s * 1000:.0f} ms", str(r.fallbacks),
        )
    console.print(table)
