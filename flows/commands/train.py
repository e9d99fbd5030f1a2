"""``malleable train``: one elastic job on a local Dask cluster, with forced rescales for demos."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from typing import TYPE_CHECKING

from elastic_tasks.coordinator.outcomes import JobFailed, JobResult
from elastic_tasks.preflight import check_entry_point
from elastic_tasks.protocol import TrainConfig
from elastic_tasks.recipe import EntryPointError, TrainingRecipe, load_entry_point
from flows.commands.shared.console import EXIT_FAILED, console, err_console, fail, warn
from flows.commands.shared.live import eval_line
from flows.config.paths import check_output_dir, check_output_file
from flows.config.settings import Settings, load_settings
from flows.recording.step_curve import sparkline, write_history_csv

if TYPE_CHECKING:
    from flows.recording.train_run import TrainRun


def parse_rescales(items: list[str], steps: int) -> list[tuple[int, int]]:
    """``STEP:GPUS`` items -> [(step, gpus)], steps strictly increasing inside (0, steps)."""
    out: list[tuple[int, int]] = []
    for item in items:
        step_s, sep, gpus_s = item.partition(":")
        try:
            step, gpus = int(step_s), int(gpus_s)
        except ValueError:
            raise ValueError(f"--rescale-at={item!r}: expected STEP:GPUS with two integers") from None
        if not sep or gpus < 1 or not (0 < step < steps):
            raise ValueError(f"--rescale-at={item!r}: need 0 < STEP < --steps={steps} and GPUS >= 1")
        if out and step <= out[-1][0]:
            raise ValueError(f"--rescale-at={item!r}: steps must increase (previous {out[-1][0]})")
        out.append((step, gpus))
    return out


def declared_switches(schedule: list[tuple[int, int]], gpus: int, restart: bool) -> frozenset[int]:
    """The steps of ``schedule`` the coordinator will publish a plan for: every one on the restart
    path, else those that change the GPU count (the batch stays, so the same count is no plan)."""
    held, previous = set(), gpus
    for step, target in schedule:
        if restart or target != previous:
            held.add(step)
        previous = target
    return frozenset(held)


# TrainConfig validates its fields; a user typed flags, so errors name those.
_FLAGS = {
    "TrainConfig.global_batch": "--batch",
    "TrainConfig.max_steps": "--steps",
    "TrainConfig.seed": "--seed",
    "TrainConfig.max_batch_per_gpu": "--max-batch-per-gpu",
    "TrainConfig.checkpoint_every": "--checkpoint-every",
    "TrainConfig.timeout_s": "--timeout",
    "TrainConfig.data_timeout_s": "--data-timeout",
    "TrainConfig.plan_wait_s": "--plan-wait",
}


def _as_flags(message: str) -> str:
    for field, flag in _FLAGS.items():
        message = message.replace(field + "=", flag + "=")
    return message


def _already_finished(path: Path, name: str) -> bool:
    """A reused directory whose checkpoint says finished: say so instead of training nothing."""
    from elastic_tasks.rank.state.elastic import check_readable, has_checkpoint, read_meta

    if not has_checkpoint(path):
        return False
    try:
        check_readable(path)
        meta = read_meta(path)
    except Exception as exc:  # a damaged checkpoint file; torch raises several types
        fail(f"--checkpoint-dir={str(path)!r}: its checkpoint cannot be read ({type(exc).__name__}: {exc}); move it aside or use a new directory")
    if not meta.finished:
        return False
    console.print(
        f"{name}: {path} holds a finished run (step {meta.step}, {meta.samples_seen:,} samples); nothing to train. "
        "Use a new --checkpoint-dir to train again.",
        markup=False,
    )
    return True


def train(
    entrypoint: Annotated[str, typer.Argument(help="package.module:function returning a TrainingRecipe")],
    gpus: Annotated[int, typer.Option("--gpus", help="ranks (Dask workers with GPU=1) to start with")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="training steps")] = 100,
    rescale_at: Annotated[list[str] | None, typer.Option("--rescale-at", help="STEP:GPUS, repeatable: rescale in place at that step")] = None,
    batch: Annotated[int | None, typer.Option("--batch", help="global batch (default: the recipe's base batch)")] = None,
    max_batch_per_gpu: Annotated[int | None, typer.Option("--max-batch-per-gpu", help="memory cap: larger shares use gradient accumulation")] = None,
    checkpoint_dir: Annotated[Path | None, typer.Option("--checkpoint-dir", help="atomic checkpoints go here")] = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="checkpoint every N steps (0: only at the end)")] = 0,
    restart: Annotated[bool, typer.Option("--restart", help="rescale through checkpoint-restart instead of in place")] = False,
    workers: Annotated[int | None, typer.Option("--workers", help="Dask workers (default: the most GPUs ever asked for)")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    timeout_s: Annotated[float, typer.Option("--timeout", help="control plane: seconds for a rendezvous, a plan, or survivors to notice a lost peer")] = 60.0,
    data_timeout_s: Annotated[float, typer.Option("--data-timeout", help="data plane: seconds one gradient allreduce or state broadcast may take")] = 600.0,
    plan_wait_s: Annotated[float | None, typer.Option("--plan-wait", help="seconds a rank waits for its plan or for peers still starting (default: max(60, 4 x --timeout); at least 2 x --timeout); lower on a small local cluster")] = None,
    preflight: Annotated[
        bool | None,
        typer.Option("--preflight/--no-preflight", help="one step of the recipe here, on the ranks' device, before any worker starts (default: MALLEABLE_PREFLIGHT, true)"),
    ] = None,
    history: Annotated[Path | None, typer.Option("--history", help="write the per-step history (loss, LR per group, GPUs, batch, samples/s) to this CSV")] = None,
    track: Annotated[bool, typer.Option("--track/--no-track", help="log the run to MLflow (MALLEABLE_TRACKING_URI): per-step curve, evaluations live, a PNG")] = True,
) -> None:
    """Train one job elastically on a local Dask cluster and print a summary.

    A live line per step (step, loss, LR, samples/s, GPUs, batch) and each periodic evaluation
    while it trains; then the generations, the loss/LR curve as sparklines, and the run in MLflow.
    """
    try:
        settings = load_settings() if preflight is None or track else None
        recipe = load_entry_point(entrypoint)
        skip_reason = _preflight(entrypoint, recipe, preflight if preflight is not None else settings.preflight)  # type: ignore[union-attr]
        schedule = parse_rescales(rescale_at or [], steps)
        global_batch = recipe.base_batch if batch is None else batch
        most = max([gpus, *(g for _, g in schedule)])
        n_workers = most if workers is None else workers
        if gpus < 1:
            raise ValueError(f"--gpus={gpus!r}: must be >= 1")
        if steps < 1:
            raise ValueError(f"--steps={steps!r}: must be >= 1")
        if checkpoint_dir is not None:
            check_output_dir(checkpoint_dir, "--checkpoint-dir")
        if n_workers < most:
            raise ValueError(f"--workers={n_workers!r}: fewer than the {most} GPUs the schedule asks for")
        if global_batch < most:
            raise ValueError(f"--batch={global_batch!r}: must be >= the largest GPU count {most} so every rank gets a sample")
        if restart and checkpoint_dir is None:
            raise ValueError("--restart: needs --checkpoint-dir")
        if history is not None:
            check_output_file(history, "--history")
        config = TrainConfig(
            global_batch=global_batch,
            max_steps=steps,
            seed=seed,
            max_batch_per_gpu=max_batch_per_gpu,
            checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
            checkpoint_every=checkpoint_every,
            timeout_s=timeout_s,
            data_timeout_s=data_timeout_s,
            plan_wait_s=plan_wait_s,
            hold_at_steps=declared_switches(schedule, gpus, restart),
        )
    except (EntryPointError, ValueError) as exc:  # SettingsError is a ValueError
        fail(_as_flags(str(exc)))
    if skip_reason:
        warn(f"pre-flight check skipped ({skip_reason}): a recipe error shows first on the ranks")
    if checkpoint_dir is not None and _already_finished(checkpoint_dir, recipe.name):
        return
    tracking = _open_tracking(settings, recipe.name, entrypoint, config, gpus) if track else None
    try:
        result = _run(entrypoint, config, gpus, schedule, n_workers, restart, recipe.name, tracking)
    except (JobFailed, TimeoutError) as exc:
        if tracking is not None:
            tracking.fail()
        fail(str(exc), EXIT_FAILED)
    for step, target in missed_rescales(schedule, result):
        warn(f"--rescale-at={step}:{target} did not happen (the job ended first, or it already had {target} GPUs)")
    if tracking is not None:
        tracking.finish(result)
    if history is not None:
        write_history_csv(result.history, history)
    _summary(result, recipe.name)


def _preflight(entrypoint: str, recipe: TrainingRecipe, wanted: bool) -> str | None:
    """Run the recipe's one-step check unless told not to; the reason it was skipped, if it was."""
    if wanted:
        check_entry_point(entrypoint, recipe)  # on the device the ranks will use, before any worker starts
        return None
    return "--no-preflight or MALLEABLE_PREFLIGHT=false"


def _open_tracking(settings: Settings | None, name: str, entrypoint: str, config: TrainConfig, gpus: int) -> TrainRun:
    from flows.recording.tracking import tracker_from_settings
    from flows.recording.train_run import TrainRun

    assert settings is not None
    params = {"entrypoint": entrypoint, "gpus": gpus, "steps": config.max_steps, "global_batch": config.global_batch, "seed": config.seed}
    return TrainRun(tracker_from_settings(settings), name, params)


def missed_rescales(schedule: list[tuple[int, int]], result: JobResult) -> list[tuple[int, int]]:
    """The requested (step, gpus) rescales no generation after the first carried out."""
    done = [(r.step, r.after) for r in result.rescales[1:]]
    return [(step, gpus) for step, gpus in schedule if not any(d_step >= step and d_after == gpus for d_step, d_after in done)]


def _run(
    entrypoint: str, config: TrainConfig, gpus: int, schedule: list[tuple[int, int]], n_workers: int, restart: bool, name: str, tracking: TrainRun | None = None
) -> JobResult:
    # Imported here: building a cluster pulls in distributed's machinery, not needed for --help.
    from distributed import Client

    from deploy.local import local_gpu_cluster
    from elastic_tasks.cluster import WorkerPool, warm_up
    from elastic_tasks.coordinator.job import JobCoordinator
    from flows.commands.shared.live import StepProgress

    with console.status(f"starting {n_workers} Dask worker(s)"):
        # -v (flows.commands.shared.console.quiet_libraries) sets this logger to INFO; the workers follow it.
        cluster = local_gpu_cluster(n_workers, log_level=logging.getLogger("distributed").getEffectiveLevel())
    with cluster, Client(cluster) as client:
        warm_up(client, entrypoint)
        job = JobCoordinator(client, WorkerPool(client), name, entrypoint, config)
        try:
            # The live line's last read (on leaving the block) comes before the board is forgotten:
            # a job shorter than one poll still ends with its final step line.
            with StepProgress(err_console, config.max_steps, job.status, on_eval=tracking.live_eval if tracking is not None else None):
                job.start(gpus)
                for step, target in schedule:
                    (job.restart_rescale if restart else job.rescale)(target, at_step=step)
                return job.wait()
        finally:
            job.close()
            job.board.forget()


def _seconds(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"  # None: never measured (the job ended first)


def _summary(result: JobResult, name: str) -> None:
    table = Table(title=f"{name}: generations")
    for col in ("version", "kind", "at step", "GPUs", "global batch", "pause (s)", "new ranks ready (s)"):
        table.add_column(col, justify="right")
    for r in result.rescales:
        kind = "restart" if r.restart else r.kind.value
        table.add_row(str(r.version), kind, str(r.step), f"{r.before} -> {r.after}", str(r.global_batch), _seconds(r.pause_s, 3), f"{r.prepare_s:.2f}")
    for rec in result.recoveries:
        table.add_row(str(rec.version), "recover", str(rec.resumed_step), f"lost {len(rec.lost)}", "-", _seconds(rec.pause_s, 3), "-")
    console.print(table)
    first = result.history[0].loss if result.history else float("nan")
    console.print(f"steps {result.steps}, samples {result.samples_seen:,}, loss {first:.4f} -> {result.final_loss or float('nan'):.4f}")
    _curve(result)
    for ev in result.evals:
        console.print(eval_line(ev), markup=False)
    if result.eval_loss is not None or result.eval_metrics:
        parts = [] if result.eval_loss is None else [f"eval loss {result.eval_loss:.4f}"]
        if result.eval_accuracy is not None:
            parts.append(f"eval accuracy {result.eval_accuracy:.1%}")
        parts += [f"{name} {value:.4g}" for name, value in result.eval_metrics if name != "loss"]
        console.print(f"final evaluation: {', '.join(parts)}", markup=False)
    for step, uid in result.stragglers:
        console.print(f"straggler flagged: {uid} at step {step}")
    if not result.finished:
        raise typer.Exit(EXIT_FAILED)


def _curve(result: JobResult) -> None:
    """The loss and LR curves as terminal sparklines (the PNG goes to MLflow)."""
    if len(result.history) < 2:
        return
    losses = [r.loss for r in result.history]
    lrs = [r.lr for r in result.history]
    console.print(f"loss {sparkline(losses)}  {losses[0]:.4g} -> {losses[-1]:.4g}", markup=False)
    console.print(f"lr   {sparkline(lrs)}  {lrs[0]:.3g} -> {lrs[-1]:.3g} (max {max(lrs):.3g})", markup=False)
