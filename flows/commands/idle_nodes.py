"""``malleable idle-nodes``: replay an idle-node trace (seed 003, BFTrainer) under several policies."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.idle_replay import replay_idle_nodes


def idle_nodes_command(
    trace: Annotated[Path | None, typer.Option(help="Idle-node trace CSV (time_s,node,state); default: generate one.")] = None,
    policy: Annotated[list[str] | None, typer.Option(help="Policy to replay (repeat); default: MILP, heuristic, FIFO.")] = None,
    nodes: Annotated[int, typer.Option(help="Nodes of the generated trace (paper: 1024 of Summit).")] = 1024,
    hours: Annotated[float, typer.Option(help="Hours of generated trace to replay.")] = 6.0,
    seed: Annotated[int, typer.Option(help="Seed of the generated trace.")] = 0,
    trainers: Annotated[int, typer.Option(help="Trainers running in parallel (the paper's Pjmax).")] = 10,
    workload: Annotated[str, typer.Option(help="'hpo' (all ShuffleNet, Sec. 5.1) or 'diverse' (Table 2 cyclically, Sec. 5.2).")] = "hpo",
    t_fwd: Annotated[float, typer.Option(help="MILP forward-looking time T_fwd, seconds.")] = 120.0,
    up_s: Annotated[float, typer.Option(help="Scale-up cost R_up, seconds.")] = 20.0,
    down_s: Annotated[float, typer.Option(help="Scale-down cost R_dw, seconds.")] = 5.0,
    objective: Annotated[str, typer.Option(help="MILP objective: throughput or scaling_efficiency.")] = "throughput",
    formulation: Annotated[str, typer.Option(help="MILP formulation: count (fast) or node (the paper's x_jn).")] = "count",
    time_limit: Annotated[float, typer.Option(help="MILP time limit per solve, seconds.")] = 10.0,
    save_trace: Annotated[Path | None, typer.Option(help="Write the (generated) trace to this CSV.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table (as --format json).")] = False,
    fmt: Annotated[str, typer.Option("--format", help="table or json (the same option as every listing command).")] = "table",
) -> None:
    """Replay idle nodes under each policy and report U = A_e / A_s, throughput, rescales and solve times."""
    if fmt not in ("table", "json"):
        from flows.commands.shared.console import fail

        fail(f"--format={fmt!r}: must be table or json")
    as_json = as_json or fmt == "json"
    replay_idle_nodes(
        trace=trace, policy=policy, nodes=nodes, hours=hours, seed=seed, trainers=trainers, workload=workload, t_fwd=t_fwd,
        up_s=up_s, down_s=down_s, objective=objective, formulation=formulation, time_limit=time_limit, save_trace=save_trace,
        as_json=as_json,
    )  # fmt: skip
