"""The ``retrain`` flow: one job, from the CLI or a schedule.

profile on a GPU worker (cached by model + that worker's hardware) -> plan against the GPU
workers available now -> elastic training on them -> metrics, the final evaluation and the
trained model in MLflow.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from distributed import Client
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from allocator.fairness.priority import priority_value
from allocator.types import JobSpec, Share
from deploy.clusters import KubeSpec, connect
from flows.config.kube import kube_spec
from elastic_tasks.cluster import WorkerPool, gpu_workers, worker_info
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.coordinator.outcomes import JobResult
from elastic_tasks.protocol import TrainConfig
from elastic_tasks.recipe import load_entry_point
from flows.recording.artifacts import artifact_key
from flows.plan_flow import plan_jobs
from flows.profile_flow import profile_flow, profile_on_workers
from flows.recording.models import register_model, save_model_dir
from flows.recording.run_guard import RunGuard
from flows.service_tasks import live_service
from flows.config.settings import Settings, load_settings
from flows.recording.tracking import MetricPoint, tracker_from_settings


@dataclass(frozen=True, slots=True)
class RetrainOutcome:
    run_id: str
    gpus: int
    global_batch: int
    steps: int
    samples_seen: int
    final_loss: float | None
    eval_accuracy: float | None
    train_s: float
    model_uri: str | None
    model_version: int | None = None  # in the registry, under the retrain's model name


class NoGpuWorkersError(RuntimeError):
    """Workers are up but too few advertise the ``GPU`` resource: no retry will change that."""


class MissingPackageError(RuntimeError):
    """The scheduler (or a worker) cannot import this package: tasks cannot even be unpickled."""


def worth_retrying(task: object, task_run: object, state: object) -> bool:
    """Retry while workers may still be starting; not for what no wait will change."""
    try:
        state.result()  # type: ignore[attr-defined]
    except (NoGpuWorkersError, MissingPackageError):
        return False
    except Exception:
        return True
    return True


@task(name="wait-for-workers", retries=3, retry_delay_seconds=5, retry_condition_fn=worth_retrying, cache_policy=NO_CACHE)
def wait_for_workers(client: Client, n: int, timeout_s: float = 60.0) -> list[str]:
    """The GPU workers that are up (at least ``n``, waiting up to ``timeout_s`` for ``n`` workers)."""
    client.wait_for_workers(n, timeout=timeout_s)
    workers = gpu_workers(client)
    if len(workers) < n:
        total = len(worker_info(client))
        raise NoGpuWorkersError(
            f"{len(workers)} of the {total} Dask workers offer the GPU resource, {n} needed: start one worker per GPU "
            "with `dask worker <scheduler address> --nthreads 1 --resources GPU=1`"
        )
    return workers


@task(name="train-elastic", cache_policy=NO_CACHE)
def train(client: Client, job_id: str, entrypoint: str, share: Share, config: TrainConfig, timeout_s: float) -> tuple[JobResult, float]:
    coordinator = JobCoordinator(client, WorkerPool(client), job_id, entrypoint, config)
    t0 = time.monotonic()
    coordinator.start(share.gpus, share.global_batch)
    try:
        result = coordinator.wait(timeout=timeout_s)
    finally:
        coordinator.close()
        coordinator.board.forget()  # a long-lived scheduler keeps nothing of this job
    return result, time.monotonic() - t0


def step_points(result: JobResult) -> list[MetricPoint]:
    points = []
    for rec in result.history:
        points += [
            MetricPoint("loss", rec.loss, rec.step),
            MetricPoint("train_accuracy", rec.accuracy, rec.step),
            MetricPoint("lr", rec.lr, rec.step),
            MetricPoint("gpus", rec.world_size, rec.step),
            MetricPoint("batch", rec.global_batch, rec.step),
        ]
    return points


def _kube(settings: Settings, workers: int) -> KubeSpec:
    return kube_spec(settings, workers)


@flow(name="retrain", log_prints=True)
def retrain_flow(
    entrypoint: str = "elastic_tasks.examples:mlp_tiny",
    epochs: float = 1.0,
    min_batch: int = 16,
    max_batch: int = 256,
    workers: int | None = None,
    policy: str | None = None,
    profile_batches: list[int] | None = None,
    timeout_s: float = 1800.0,
    job_name: str | None = None,
    priority: str | int = "default",
    model_name: str | None = None,
) -> RetrainOutcome:
    """Retrain one model elastically on the workers available and log it to MLflow.

    ``priority``: the job's class on a team's service (``nightly`` for the scheduled deployment:
    its team's GPUs go to it first; ``allocator.fairness.priority``); alone it runs on what is free.
    ``model_name``: the registered model a finished retrain adds a version to (default: the job's name)."""
    settings = load_settings(workers=workers, policy=policy)
    if epochs <= 0:
        raise ValueError(f"epochs={epochs!r}: must be > 0")
    level = priority_value(priority)
    recipe = load_entry_point(entrypoint)
    job_id = job_name or recipe.name
    batches = profile_batches or [8, 16, 32, 64]
    tracker = tracker_from_settings(settings)
    total = max(1, int(round(epochs * len(recipe.dataset))))  # type: ignore[arg-type]
    store_url = live_service(settings)
    if store_url is not None:
        # A team's scheduler runs: the job shares its cluster instead of taking the workers free now.
        # Its workers are busy training, so the profile is this machine's (as its ranks would run);
        # the service refits the model from the job's own steps as it trains.
        profile = profile_flow(entrypoint, batch_sizes=batches)
        spec = JobSpec(id=job_id, workload=entrypoint, total_samples=total, min_batch=min_batch, max_batch=max_batch, max_gpus=settings.workers, profile=profile, priority=level)
        return _retrain_through_service(store_url, spec, tracker, timeout_s, epochs, model_name or job_id, settings.resolved_tracking_uri)
    # The guard ends the run FAILED/KILLED if training raises or is interrupted (never left RUNNING).
    with RunGuard(tracker) as guard, connect(settings.cluster.value, workers=settings.workers, address=settings.scheduler_address, kube=_kube(settings, settings.workers)) as client:
        available = wait_for_workers(client, 1 if settings.cluster.value != "local" else settings.workers)
        profile = profile_on_workers(client, entrypoint, batch_sizes=batches)  # where the ranks will run
        spec = JobSpec(id=job_id, workload=entrypoint, total_samples=total, min_batch=min_batch, max_batch=max_batch, max_gpus=len(available), profile=profile)
        plan = plan_jobs([spec], len(available), settings.policy)
        share = plan.jobs[0].share
        assert share is not None
        checkpoint_dir = settings.checkpoint_location(f"retrain-{job_id}-{uuid.uuid4().hex[:8]}")
        config = TrainConfig(global_batch=share.global_batch, total_samples=total, max_batch_per_gpu=profile.max_batch_per_gpu, checkpoint_dir=str(checkpoint_dir))
        run = guard.start_run(
            f"retrain-{job_id}",
            params={"entrypoint": entrypoint, "policy": settings.policy, "gpus": share.gpus, "global_batch": share.global_batch, "epochs": epochs, "total_samples": total, "workers_available": len(available), "hardware": profile.hardware},
            tags={"malleable.mode": "retrain"},
        )
        result, train_s = train(client, job_id, entrypoint, share, config, timeout_s)
    finals = {"steps": result.steps, "samples_seen": result.samples_seen, "train_s": train_s, "samples_per_s": result.samples_seen / train_s if train_s > 0 else 0.0}
    if result.eval_accuracy is not None:
        finals["eval_accuracy"] = result.eval_accuracy
    if result.eval_loss is not None:
        finals["eval_loss"] = result.eval_loss
    finals.update({f"eval_{name}": value for name, value in result.eval_metrics})  # the recipe's own metrics
    tracker.log_metrics(run, step_points(result) + [MetricPoint(k, v, result.steps) for k, v in finals.items()])
    model_uri = None
    if result.finished:
        with tempfile.TemporaryDirectory() as tmp:
            tracker.log_artifacts(run, save_model_dir(entrypoint, checkpoint_dir, Path(tmp) / "model"), "model")
        run_id = tracker.run_id(run)
        model_uri = f"runs:/{run_id}/model" if run_id else None
    version = register_model(settings.resolved_tracking_uri, run_id, model_name or job_id) if model_uri and tracker.flush() else None
    guard.end_run(run, "FINISHED" if result.finished else "FAILED")
    create_table_artifact(
        key=artifact_key("retrain", job_id),
        table=[{"job": job_id, "gpus": share.gpus, "global_batch": share.global_batch, "steps": result.steps, "final_loss": f"{result.final_loss or float('nan'):.4f}", "eval_accuracy": "-" if result.eval_accuracy is None else f"{result.eval_accuracy:.3f}", "train_s": f"{train_s:.1f}"}],
        description=f"retrain of {entrypoint}",
    )
    create_markdown_artifact(
        key=artifact_key("retrain", job_id, "summary"),
        markdown=f"# Retrained {job_id}\n\n* planned {share.gpus} GPUs, global batch {share.global_batch} ({settings.policy})\n* {result.steps} steps in {train_s:.1f} s\n* eval accuracy {result.eval_accuracy}\n* model: `{model_uri or 'buffered (MLflow unreachable)'}`\n",
    )
    if not result.finished:
        raise RuntimeError(f"job {job_id}: training did not finish")
    return RetrainOutcome(run, share.gpus, share.global_batch, result.steps, result.samples_seen, result.final_loss, result.eval_accuracy, train_s, model_uri, version)


def _retrain_through_service(store_url: str, spec: JobSpec, tracker, timeout_s: float, epochs: float, model_name: str, tracking_uri: str) -> RetrainOutcome:  # noqa: ANN001
    """Submit the retraining job to the running service, wait, then log the model from its checkpoint."""
    from flows.service_tasks import submit_job, wait_for_jobs
    from service.client import ServiceClient
    from service.redaction import redact_url

    t0 = time.monotonic()
    job = submit_job(store_url, spec, submitter=f"retrain:{spec.workload}")
    print(f"submitted {spec.id} to the service at {redact_url(store_url)} as job {job}")
    [row] = wait_for_jobs(store_url, [job], timeout_s)
    train_s = time.monotonic() - t0
    shares = [a for a in ServiceClient(store_url).store.allocations(job) if a.gpus > 0]
    gpus, batch = (shares[-1].gpus, shares[-1].batch) if shares else (0, 0)
    finished = row.state.value == "finished"
    with RunGuard(tracker) as guard:
        run = guard.start_run(
            f"retrain-{spec.id}",
            params={"entrypoint": spec.workload, "service_job": job, "epochs": epochs, "total_samples": spec.total_samples, "hardware": spec.profile.hardware},
            tags={"malleable.mode": "retrain", "malleable.service_job": job},
        )
        tracker.log_metrics(run, [MetricPoint("samples_seen", row.samples_done, 0), MetricPoint("train_s", train_s, 0), MetricPoint("gpus", gpus, 0)])
        model_uri = None
        if finished and row.checkpoint_dir:
            with tempfile.TemporaryDirectory() as tmp:
                tracker.log_artifacts(run, save_model_dir(spec.workload, row.checkpoint_dir, Path(tmp) / "model"), "model")
            run_id = tracker.run_id(run)
            model_uri = f"runs:/{run_id}/model" if run_id else None
        version = register_model(tracking_uri, run_id, model_name) if model_uri and tracker.flush() else None
        guard.end_run(run, "FINISHED" if finished else "FAILED")
    if not finished:
        raise RuntimeError(f"job {spec.id} ({job}) {row.state.value}" + (f": {row.error}" if row.error else ""))
    return RetrainOutcome(run, gpus, batch, 0, int(row.samples_done), None, None, train_s, model_uri, version)
