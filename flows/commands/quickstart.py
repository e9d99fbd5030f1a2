"""``malleable quickstart``: three jobs on four virtual GPUs, real elastic training, recorded."""

from __future__ import annotations

import math
import time
from typing import Annotated

import typer

from flows.commands.shared.common import prefect_state_or_fail, scheduler_or_fail, settings_or_fail
from flows.commands.shared.common import print_ui_hint
from flows.commands.shared.tables import outcome_table
from flows.commands.shared.console import EXIT_FAILED, console, err_console, fail


def quickstart(
    workers: Annotated[int, typer.Option("--workers", "-w", help="Virtual GPU workers (Dask worker processes).")] = 4,
    scale: Annotated[float, typer.Option("--scale", help="Multiply every job's samples (0.25 for a fast smoke run).")] = 1.0,
    interval: Annotated[float, typer.Option("--interval", help="Δ: seconds between re-allocations.")] = 5.0,
) -> None:
    """Run the cluster flow on a LocalCluster: three jobs arrive, elastic_dp grows and shrinks them in place."""
    if not (math.isfinite(interval) and interval > 0):
        fail(f"--interval={interval}: must be a finite number > 0")
    settings_or_fail()  # the environment first: a bad MALLEABLE_* stops us even though flags have defaults
    settings = settings_or_fail(workers=workers, interval_s=interval)
    if not (scale > 0):
        fail(f"scale={scale}: must be > 0")
    prefect_state_or_fail()
    scheduler_or_fail(settings)
    from flows.commands.shared.interrupts import install
    from flows.commands.shared.live import LoopProgress
    from flows.quickstart_flow import quickstart_flow

    console.print(f"[bold]malleable quickstart[/]: 3 jobs, {workers} virtual GPU workers, elastic_dp, Δ = {interval:g} s; state in {settings.state_dir}", soft_wrap=True)
    install(lambda sig: f"interrupted ({sig}): ranks stopped, cluster shut down, MLflow runs marked KILLED; jobs resume from their checkpoints in {settings.resolved_checkpoint_dir}")
    t0 = time.monotonic()
    try:
        with LoopProgress(err_console) as progress:
            outcome = quickstart_flow(workers=workers, scale=scale, interval_s=interval, on_step=progress)
    except Exception as exc:
        fail(f"quickstart failed: {type(exc).__name__}: {exc}", code=EXIT_FAILED)
    rec = outcome.recorded
    console.print(outcome_table("quickstart: per-job results", rec.outcomes))
    in_place = sum(1 for e in outcome.result.events if e.kind.value == "in_place")
    console.print(
        f"{in_place} in-place rescales, average JCT {rec.metrics.avg_jct_s or 0:.1f} s, GPU utilisation {rec.metrics.gpu_utilisation:.0%}; "
        f"cluster run {outcome.wall_s:.0f} s, total {time.monotonic() - t0:.0f} s"
    )
    console.print(f"MLflow: experiment [bold]{settings.experiment}[/], parent run [bold]{rec.parent_run}[/] with {len(rec.job_runs)} nested job runs")
    print_ui_hint()
