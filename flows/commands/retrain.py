"""``malleable retrain``: one job — profile, plan on the workers available, train elastically, log the model."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from allocator.policies import UnknownPolicyError, parse_policy
from elastic_tasks.recipe import load_entry_point
from flows.commands.shared.common import prefect_state_or_fail, scheduler_or_fail, settings_or_fail
from flows.commands.shared.console import EXIT_FAILED, console, fail


def retrain(
    entrypoint: Annotated[str, typer.Argument(help="Training entry point 'package.module:function'.")] = "elastic_tasks.examples:mlp_tiny",
    epochs: Annotated[float, typer.Option("--epochs", help="Passes over the recipe's dataset.")] = 1.0,
    min_batch: Annotated[int, typer.Option("--min-batch", help="Smallest global batch the plan may pick.")] = 16,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Largest global batch the plan may pick.")] = 256,
    workers: Annotated[int | None, typer.Option("--workers", "-w", help="(Virtual) GPU workers (default MALLEABLE_WORKERS).")] = None,
    policy: Annotated[str | None, typer.Option("--policy", "-p", help="Policy (default MALLEABLE_POLICY).")] = None,
    model_name: Annotated[str | None, typer.Option("--model-name", help="Registered model the trained model becomes a new version of (default: the recipe's name).")] = None,
) -> None:
    """Retrain one model elastically and log metrics and the model to MLflow."""
    settings = settings_or_fail(workers=workers, policy=policy)
    if not (math.isfinite(epochs) and epochs > 0):
        fail(f"--epochs={epochs}: must be a finite number > 0")
    if not (0 < min_batch <= max_batch):
        fail(f"min_batch={min_batch}, max_batch={max_batch}: need 0 < min_batch <= max_batch")
    if model_name is not None and not model_name.strip():
        fail(f"--model-name={model_name!r}: must not be empty")
    try:
        if policy is not None:
            parse_policy(policy).build()
        load_entry_point(entrypoint)
    except UnknownPolicyError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc))
    prefect_state_or_fail()
    scheduler_or_fail(settings)
    from flows.retrain_flow import retrain_flow

    try:
        out = retrain_flow(entrypoint=entrypoint, epochs=epochs, min_batch=min_batch, max_batch=max_batch, workers=workers, policy=policy, model_name=model_name)
    except Exception as exc:
        fail(f"retrain failed: {type(exc).__name__}: {exc}", code=EXIT_FAILED)
    acc = "-" if out.eval_accuracy is None else f"{out.eval_accuracy:.3f}"
    console.print(f"retrained on {out.gpus} GPUs, global batch {out.global_batch}: {out.steps} steps in {out.train_s:.1f} s, eval accuracy {acc}")
    console.print(f"model: [bold]{out.model_uri or 'buffered until MLflow is reachable'}[/]" + (f", registered as version {out.model_version}" if out.model_version else ""))
