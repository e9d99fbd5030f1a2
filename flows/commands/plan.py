"""``malleable plan``: what a policy would give each job of a jobs file on N GPUs."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from allocator.physics.choice import Physics
from allocator.plan import Plan, make_plan
from allocator.policies import UnknownPolicyError, parse_policy
from allocator.types import InfeasibleError
from flows.commands.shared.console import console, fail
from flows.config.jobfile import load_jobs_file


class OutputFormat(str, Enum):
    TABLE = "table"
    JSON = "json"


def plan_as_dict(plan: Plan) -> dict[str, object]:
    return {
        "policy": plan.policy,
        "physics": plan.physics.value,
        "capacity": plan.capacity,
        "gpus_used": plan.gpus_used,
        "jobs": [
            {
                "job": j.job_id,
                "gpus": j.share.gpus if j.share else 0,
                "batch": j.share.global_batch if j.share else 0,
                "batch_per_gpu": j.share.batch_per_gpu if j.share else 0,
                "samples_per_s": round(j.samples_per_s, 3),
                "goodput_per_s": round(j.goodput_per_s, 3),
                "efficiency_vs_linear": round(j.efficiency_vs_linear, 4),
                "predicted_runtime_s": None if j.predicted_runtime_s is None else round(j.predicted_runtime_s, 1),
            }
            for j in plan.jobs
        ],
        "waiting": list(plan.waiting),
    }


def _table(plan: Plan) -> Table:
    goodput = plan.physics is Physics.GOODPUT
    table = Table(title=f"{plan.policy} on {plan.capacity} GPUs ({plan.gpus_used} used), {plan.physics.value} physics")
    columns = ("job", "GPUs", "batch", "per-GPU batch", "samples/s", *(("goodput/s",) if goodput else ()), "efficiency vs linear", "predicted runtime")
    for col in columns:
        table.add_column(col, justify="left" if col == "job" else "right", no_wrap=col == "job")
    for j in plan.jobs:
        assert j.share is not None
        runtime = "-" if j.predicted_runtime_s is None else f"{j.predicted_runtime_s / 60:.1f} min"
        table.add_row(
            j.job_id,
            str(j.share.gpus),
            str(j.share.global_batch),
            str(j.share.batch_per_gpu),
            f"{j.samples_per_s:,.0f}",
            *((f"{j.goodput_per_s:,.0f}",) if goodput else ()),
            f"{j.efficiency_vs_linear:.0%}",
            runtime,
        )
    for job_id in plan.waiting:
        table.add_row(job_id, "0", "-", "-", "-", *(("-",) if goodput else ()), "-", "queued")
    return table


def plan(
    jobs_file: Annotated[Path, typer.Argument(help="Jobs file, YAML or JSON (docs/jobs-file.md).")],
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", help="GPUs in the cluster (default: the file's 'gpus').")] = None,
    policy: Annotated[str | None, typer.Option("--policy", "-p", help="Policy name (default: the file's, else elastic_dp).")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", "-f", help="table or json.")] = OutputFormat.TABLE,
) -> None:
    """Show the GPUs and batch size a policy gives each job, with predicted throughput."""
    try:
        spec = load_jobs_file(jobs_file)
        capacity = gpus if gpus is not None else spec.gpus
        if capacity is None:
            fail("gpus: not given; pass --gpus N or set 'gpus' in the jobs file")
        if capacity <= 0:
            fail(f"gpus={capacity}: must be a positive integer")
        for job in spec.jobs:
            if job.min_gpus > capacity:
                # It would show as "queued" for ever: it can never run on this cluster.
                fail(f"{jobs_file}: job {job.id!r}.min_gpus={job.min_gpus}: more than the cluster's gpus={capacity}; it can never run")
        chosen = parse_policy(policy or spec.policy or "elastic_dp").build()
        result = make_plan(spec.jobs, capacity, chosen)
    except UnknownPolicyError as exc:
        fail(str(exc))
    except InfeasibleError as exc:
        fail(f"infeasible: {exc}", code=1)
    except ValueError as exc:
        fail(f"{jobs_file}: {exc}")
    if output is OutputFormat.JSON:
        typer.echo(json.dumps(plan_as_dict(result), indent=2))
    else:
        console.print(_table(result))
