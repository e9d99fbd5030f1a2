"""``malleable run``: a jobs file on the cluster (real elastic training) or, with --simulate, simulated."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from allocator.policies import UnknownPolicyError, parse_policy
from flows.commands.shared.common import prefect_state_or_fail, print_ui_hint, scheduler_or_fail, settings_or_fail
from flows.commands.shared.tables import jobs_table, outcome_table
from flows.commands.shared.console import EXIT_FAILED, console, err_console, fail
from flows.config.jobfile import load_jobs_file


def run(
    jobs_file: Annotated[Path, typer.Argument(help="Jobs file, YAML or JSON (docs/jobs-file.md); workload = entry point or example name.")],
    simulate: Annotated[bool, typer.Option("--simulate", help="Run the same loop simulated instead of on the cluster.")] = False,
    workers: Annotated[int | None, typer.Option("--workers", "-w", help="(Virtual) GPU workers (default MALLEABLE_WORKERS, 4).")] = None,
    policy: Annotated[str | None, typer.Option("--policy", "-p", help="Policy (default: the file's, else MALLEABLE_POLICY).")] = None,
    interval: Annotated[float | None, typer.Option("--interval", help="Δ: seconds between re-allocations (default MALLEABLE_INTERVAL_S).")] = None,
    name: Annotated[str | None, typer.Option("--name", help="MLflow run name.")] = None,
    teams: Annotated[Path | None, typer.Option("--teams", help="With --simulate: teams share the cluster (default MALLEABLE_TEAMS); MLflow records how fair the run was.")] = None,
) -> None:
    """Run a jobs file through the autoscaling loop: real elastic training on Dask workers, or simulated."""
    settings = settings_or_fail(workers=workers, policy=policy, interval_s=interval, teams=teams)
    if teams is not None and not simulate:
        fail(f"--teams={str(teams)!r}: a real run of a jobs file is one team's; give the teams file to the service (`malleable serve --teams`) or add --simulate")
    try:
        spec = load_jobs_file(jobs_file)
        if simulate and settings.teams is not None:
            from flows.config.teams_file import load_teams_file

            load_teams_file(settings.teams)  # a bad teams file: one line, before any flow
        if policy is not None:
            parse_policy(policy).build()
        chosen = policy or spec.policy or settings.policy
        if chosen.startswith("idle_nodes"):
            # The loop's cluster is a GPU count; idle-node policies place jobs on named nodes.
            flag = "--policy" if policy is not None else f"{jobs_file}: policy"
            fail(f"{flag}={chosen!r}: idle-node policies need node names, which `run` does not have; replay a node trace with `malleable idle-nodes` or `simulate TRACE -p {chosen}`")
        if not simulate:
            from flows.cluster_flow import check_trainable

            check_trainable(spec.jobs)
    except UnknownPolicyError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(f"{jobs_file}: {exc}" if str(jobs_file) not in str(exc) else str(exc))
    prefect_state_or_fail()  # a damaged Prefect database: one line, before any flow
    if not simulate:
        scheduler_or_fail(settings)  # an unreachable scheduler address: one line in seconds
    if simulate:
        from flows.prefect_runs import record_in_prefect, run_flow
        from flows.simulate_flow import simulate_flow

        gpus = workers or spec.gpus or settings.workers
        outcome = run_flow(
            simulate_flow, record_in_prefect(settings.prefect_runs), str(jobs_file), gpus=gpus, policy=policy, interval_s=interval, run_name=name, parsed=spec, teams_file=None if settings.teams is None else str(settings.teams)
        )
        console.print(outcome_table(f"{jobs_file.name}: simulated on {gpus} GPUs", outcome.outcomes))
        console.print(f"MLflow parent run [bold]{outcome.recorded.parent_run}[/]")
    else:
        from flows.cluster_flow import JobsFailed, cluster_flow
        from flows.commands.shared.interrupts import install
        from flows.commands.shared.live import LoopProgress

        install(lambda sig: f"interrupted ({sig}): ranks stopped, cluster shut down, MLflow runs marked KILLED; jobs resume from their checkpoints in {settings.resolved_checkpoint_dir}")
        try:
            with LoopProgress(err_console, len(spec.jobs)) as progress:
                outcome = cluster_flow(str(jobs_file), workers=workers, policy=policy, interval_s=interval, run_name=name, on_step=progress, parsed=spec)
        except JobsFailed as exc:  # recorded and published; the others ran to the end
            outcome = exc.outcome
        except Exception as exc:  # the flow run is recorded as failed in Prefect; say why in one line
            fail(f"cluster run failed: {type(exc).__name__}: {exc}", code=EXIT_FAILED)
        if outcome.service_jobs:
            console.print(f"{jobs_file.name}: scheduled by the running service ({outcome.wall_s:.0f} s)", highlight=False, markup=False)
            console.print(jobs_table(outcome.service_jobs))
        else:
            console.print(outcome_table(f"{jobs_file.name}: real run on {settings.workers} workers ({outcome.wall_s:.0f} s)", outcome.recorded.outcomes))
        console.print(f"MLflow parent run [bold]{outcome.recorded.parent_run}[/], {outcome.recorded.metrics.rescales} rescales")
        unfinished = outcome.unfinished
        if unfinished:
            # The others ran to the end; the command still says the run did not do all it was asked.
            for line in unfinished:
                err_console.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_FAILED)
    print_ui_hint()
