"""The ``cluster`` flow: the allocator's loop driving real elastic jobs on Dask workers.

Jobs from a jobs file arrive at their ``arrival_s``; every Δ (and on each arrival and
completion) the policy re-allocates and the ``DaskExecutor`` starts, grows and shrinks jobs
in place. The same loop with a jumping clock and the modelled executor is the ``simulate``
flow, so the two runs of one jobs file compare job by job.

A job's ``workload`` names what to train: a ``package.module:function`` entry point or the
name of a built-in example (``elastic_tasks.examples``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from distributed import Client
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from allocator.admission import OverflowMode
from allocator.loop import LoopResult, LoopSettings, StepReport
from allocator.policies import parse_policy
from allocator.specs import JobsFile
from allocator.types import JobSpec
from deploy.clusters import connect
from elastic_tasks.cluster import warm_up
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.executor import JobSettings
from allocator.wall_split import WallSplit
from elastic_tasks.coordinator.outcomes import JobResult
from elastic_tasks.recipe import load_entry_point
from elastic_tasks.workloads import resolve_workload
from flows.commands.shared.interrupts import on_interrupt
from flows.recording.artifacts import ProgressArtifact, publish_results, summary_markdown
from flows.config.jobfile import load_jobs_file
from flows.config.kube import kube_spec
from flows.recording.live_tracking import LiveRecorder
from flows.recording.record import MeasuredJob, RecordedRun, parent_params, record_run
from flows.recording.run_guard import status_for
from flows.recording.service_run import loop_result_from_store, record_service_run
from flows.retrain_flow import MissingPackageError, worth_retrying, wait_for_workers
from flows.config.settings import Settings, load_settings
from flows.recording.tracking import MetricPoint, tracker_from_settings
from flows.service_tasks import live_service, service_gpus, submit_at_arrivals, wait_for_jobs
from service.embedded import EmbeddedService
from service.job_metrics import mean_rescale_pause_s
from service.redaction import redact_url
from service.store.records import JobRow
from service.runner import ServiceConfig

def entrypoint_for(spec: JobSpec) -> str:
    """The training entry point a job's ``workload`` names."""
    return resolve_workload(spec.workload, spec.id)


def check_trainable(jobs: Sequence[JobSpec]) -> None:
    """Fail before any cluster starts: every job names an importable recipe."""
    for spec in jobs:
        load_entry_point(entrypoint_for(spec))


@dataclass(frozen=True, slots=True)
class ClusterOutcome:
    result: LoopResult
    recorded: RecordedRun
    wall_s: float
    job_results: Mapping[str, JobResult]  # what the trainer measured, per job (empty: a running service trained them)
    service_jobs: tuple[JobRow, ...] = ()  # the jobs as a running service's store holds them
    wall_splits: Mapping[str, WallSplit] = dataclasses.field(default_factory=dict)  # per finished job: where its wall time went

    @property
    def unfinished(self) -> list[str]:
        """One line per job that did not finish, naming it and why."""
        return [f"job {o.job_id} {o.state}" + (f": {o.error.removeprefix(f'job {o.job_id}: ')}" if o.error else "") for o in self.recorded.outcomes if not o.ok]


class JobsFailed(RuntimeError):
    """A run whose jobs did not all finish: the flow run fails, after recording and publishing what
    did happen (``outcome``; the artifact names each failure)."""

    def __init__(self, outcome: ClusterOutcome) -> None:
        super().__init__("; ".join(outcome.unfinished))
        self.outcome = outcome


@task(name="load-jobs-file")
def load_jobs(jobs_file: str) -> tuple[tuple[JobSpec, ...], int | None, str | None]:
    spec = load_jobs_file(Path(jobs_file))
    return spec.jobs, spec.gpus, spec.policy


@task(name="warm-up-workers", retries=2, retry_delay_seconds=5, retry_condition_fn=worth_retrying, cache_policy=NO_CACHE)
def warm_up_workers(client: Client, entrypoints: Sequence[str]) -> None:
    """Import torch and build each recipe on every worker before the clock starts, so a job's
    first start (and every later join) costs the regroup, not a cold import."""
    for entry in sorted(set(entrypoints)):
        try:
            warm_up(client, entry)
        except ModuleNotFoundError as exc:
            raise MissingPackageError(
                f"the Dask scheduler or a worker cannot import {exc.name!r}: install malleable (and torch) on the "
                "scheduler and on every worker — the scheduler unpickles each task it is sent"
            ) from None


@task(name="autoscaling-loop", cache_policy=NO_CACHE)
def drive(
    client: Client,
    jobs: Sequence[JobSpec],
    policy: str,
    loop_settings: LoopSettings,
    job_settings: JobSettings,
    store_url: str,
    observer: Callable[[StepReport], None],
    sample: Callable[[Iterable[tuple[str, JobCoordinator]]], None] | None = None,
) -> tuple[LoopResult, dict, int]:
    """The run's jobs through an embedded scheduler service: each submitted at its arrival time,
    scheduled by the same store-fed loop a long-lived ``malleable serve`` runs. Returns the loop's
    result, each job's measurements and the wall-clock epoch (ms) of the loop's t = 0.

    ``sample`` sees the running jobs' coordinators at every decision (live MLflow metrics)."""
    config = ServiceConfig(
        store_url=store_url, checkpoint_root=job_settings.checkpoint_root or "", policy=policy,
        interval_s=loop_settings.interval_s, overflow=loop_settings.overflow, react=loop_settings.react_to_events,
        strict_fifo=loop_settings.strict_fifo, checkpoint_every=max(1, job_settings.checkpoint_every or 50),
        collective_timeout_s=job_settings.timeout_s, tracking_uri=None,  # the flow records the run itself
    )  # fmt: skip
    holder: list[EmbeddedService] = []

    def observe(report: StepReport) -> None:
        observer(report)
        executor = holder[0].service.executor if holder else None
        if sample is not None and executor is not None:
            try:
                sample(list(executor.jobs.items()))
            except Exception as exc:  # live metrics are a view; the run goes on without them
                print(f"live metrics skipped: {type(exc).__name__}: {exc}")

    # The run's store is its own: the jobs keep the file's ids there, so the loop's result, its
    # reports and the executor's results name jobs as the file does (nothing to map back).
    with EmbeddedService(config, client, observer=observe) as service, on_interrupt(service.abort):
        holder.append(service)
        ids = service.submit_at_arrivals(jobs, key_prefix=Path(store_url).name)
        service.wait(list(ids.values()))
    executor = service.service.executor
    if executor is not None:
        forget_jobs(executor.jobs.values())
    return service.result, service.job_results(), service.service.started_ms


def forget_jobs(coordinators: Iterable[JobCoordinator]) -> None:
    """Clear finished jobs' plans, Variables and Events off the scheduler (it may outlive us)."""
    for job in coordinators:
        try:
            job.board.forget()
        except Exception as exc:  # the run's result stands; a scheduler already gone has nothing to clear
            print(f"could not clear job {job.board.job_id} off the scheduler: {type(exc).__name__}: {exc}")


def step_timestamps_ms(history: Sequence, job_start_ms: int) -> list[int]:
    """When each step began: the job's start plus the recording rank's step durations before it."""
    out, elapsed_s = [], 0.0
    for rec in history:
        out.append(job_start_ms + int(elapsed_s * 1000))
        elapsed_s += max(0.0, rec.wall_s)
    return out


def measured_jobs(results: Mapping[str, JobResult], result: LoopResult, started_ms: int, splits: Mapping[str, WallSplit] | None = None) -> dict[str, MeasuredJob]:
    """What the trainer measured per job, its per-step series stamped with wall-clock times (and
    where its wall time went, from ``splits``)."""
    measured: dict[str, MeasuredJob] = {}
    starts = {r.job_id: r.start for r in result.jobs}
    for job_id, r in results.items():
        job_start_ms = started_ms + int((starts.get(job_id) or 0.0) * 1000)
        series = tuple(
            p
            for rec, ts in zip(r.history, step_timestamps_ms(r.history, job_start_ms))
            for p in (MetricPoint("loss", rec.loss, rec.step, ts), MetricPoint("train_accuracy", rec.accuracy, rec.step, ts), MetricPoint("lr", rec.lr, rec.step, ts))
        )
        measured[job_id] = MeasuredJob(
            steps=r.steps,
            samples_seen=r.samples_seen,
            series=series,
            accuracy=r.eval_accuracy,
            eval_loss=r.eval_loss,
            eval_metrics=tuple(r.eval_metrics),
            loss=r.final_loss,
            rescale_pause_s_mean=mean_rescale_pause_s(r),
            wall_split=tuple((splits[job_id].as_dict() | {"unaccounted_pct": splits[job_id].unaccounted_pct}).items()) if splits and job_id in splits else (),
        )
    return measured


@flow(name="cluster", log_prints=True)
def cluster_flow(
    jobs_file: str,
    workers: int | None = None,
    policy: str | None = None,
    interval_s: float | None = None,
    overflow: str | None = None,
    react: bool = True,
    run_name: str | None = None,
    collective_timeout_s: float = 60.0,
    on_step: Callable[[StepReport], None] | None = None,
    to_running_service: bool = True,
    parsed: JobsFile | None = None,
) -> ClusterOutcome:
    """Run the jobs of ``jobs_file`` on the configured Dask cluster under the autoscaling loop.

    ``parsed``: ``jobs_file`` as the caller already read it, so a command parses it once."""
    settings = load_settings(workers=workers, policy=policy, interval_s=interval_s, overflow=overflow)
    jobs, _, file_policy = load_jobs(jobs_file) if parsed is None else (parsed.jobs, parsed.gpus, parsed.policy)
    check_trainable(jobs)
    chosen = policy or file_policy or settings.policy
    parse_policy(chosen).build()
    loop_settings = LoopSettings(interval_s=settings.interval_s, overflow=OverflowMode(settings.overflow), react_to_events=react)
    job_settings = JobSettings(timeout_s=collective_timeout_s, checkpoint_root=settings.checkpoint_location(f"cluster-{int(time.time())}"))
    progress = ProgressArtifact(f"jobs finished of {len(jobs)}", len(jobs))

    def observe(report: StepReport) -> None:
        progress.update(report.finished_total)
        for e in report.events:
            print(f"t={report.time:6.1f}s {e.job_id}: {e.kind.value} {e.before.gpus if e.before else 0}->{e.after.gpus if e.after else 0} GPUs (cost {'-' if e.cost_s is None else f'{e.cost_s:.2f}'} s)")
        if on_step is not None:
            on_step(report)

    store_url = live_service(settings) if to_running_service else None
    if store_url is not None:
        # A team's service runs: its jobs share that cluster, and the run is recorded like any other.
        return _through_service(store_url, jobs, jobs_file, settings, loop_settings, run_name, progress)

    kube = kube_spec(settings, settings.workers)
    t0 = time.monotonic()
    run_dir = settings.state_dir.resolve() / "runs" / f"{Path(jobs_file).stem}-{int(time.time())}"
    with connect(settings.cluster.value, workers=settings.workers, address=settings.scheduler_address, kube=kube) as client:
        available = wait_for_workers(client, settings.workers if settings.cluster.value == "local" else 1)
        warm_up_workers(client, [entrypoint_for(j) for j in jobs])
        tracker = tracker_from_settings(settings)
        name = run_name or f"cluster-{Path(jobs_file).stem}-{chosen}"
        extra = {"jobs_file": str(jobs_file), "cluster": settings.cluster.value, "workers": len(available)}
        live = LiveRecorder(
            tracker, name, {j.id: j for j in jobs}, parent_params("real", chosen, len(available), loop_settings, len(jobs), extra),
            {"malleable.mode": "real", "malleable.policy": chosen},
        )  # fmt: skip
        try:
            with on_interrupt(lambda: live.end_all("KILLED")):
                result, results, start_ms = drive(client, jobs, chosen, loop_settings, job_settings, f"sqlite:///{run_dir / 'jobs.db'}", observe, live.sample)
        except BaseException as exc:  # no run is left RUNNING in MLflow
            live.end_all(status_for(exc))
            raise
    wall_s = time.monotonic() - t0
    progress.update(len(jobs))
    splits = stored_splits(f"sqlite:///{run_dir / 'jobs.db'}")
    recorded = record_run(
        tracker, name, result, {j.id: j for j in jobs}, mode="real", start_ms=start_ms,
        params=extra, measured=measured_jobs(results, result, start_ms, splits), live=live.runs,
    )  # fmt: skip
    title = f"{Path(jobs_file).name} on {len(available)} {settings.cluster.value} GPU workers under {chosen}"
    return _published(ClusterOutcome(result, recorded, wall_s, results, wall_splits=splits), title)


def stored_splits(store_url: str) -> dict[str, WallSplit]:
    """Each job's wall split as its service recorded it in the store, by the job's name (the jobs file's id)."""
    from service.store import JobStore

    store = JobStore(store_url, create=False)
    try:
        return {r.name: WallSplit.from_dict(r.wall_split) for r in store.jobs() if r.wall_split}
    finally:
        store.close()


def _published(outcome: ClusterOutcome, title: str) -> ClusterOutcome:
    """The run's Prefect artifacts; JobsFailed (the flow run fails) if a job did not finish."""
    recorded = outcome.recorded
    lines = [f"MLflow parent run `{recorded.parent_run}`", f"{recorded.metrics.rescales} rescales, wall time {outcome.wall_s:.1f} s"]
    lines += [f"**{line}**" for line in outcome.unfinished]
    publish_results("cluster", outcome.result, recorded.outcomes, summary_markdown(title, recorded.outcomes, lines))
    if outcome.unfinished:
        raise JobsFailed(outcome)
    return outcome


def _through_service(
    store_url: str, jobs: Sequence[JobSpec], jobs_file: str, settings: Settings, loop_settings: LoopSettings, run_name: str | None, progress: ProgressArtifact
) -> ClusterOutcome:
    """Submit to the running service under an MLflow parent run, wait, record the run from the store."""
    from service.client import ServiceClient

    submitter = f"cluster-flow:{Path(jobs_file).name}"
    name = run_name or f"cluster-{Path(jobs_file).stem}-service"
    tracker = tracker_from_settings(settings)
    params = {"mode": "service", "jobs_file": str(jobs_file), "cluster": "service", "job_store": redact_url(store_url), "submitter": submitter,
              "interval_s": loop_settings.interval_s, "jobs": len(jobs)}  # fmt: skip
    parent = tracker.start_run(name, params=params, tags={"malleable.mode": "service", "malleable.policy": "service", "malleable.submitter": submitter})
    t0 = time.monotonic()
    try:
        with on_interrupt(lambda: tracker.end_run(parent, "KILLED")):
            ids = submit_at_arrivals(store_url, jobs, submitter=submitter, mlflow_parent_run_id=tracker.run_id(parent))
            print(f"submitted {len(ids)} job(s) to the service at {redact_url(store_url)}: " + ", ".join(f"{n}={i}" for n, i in ids.items()))
            rows = wait_for_jobs(store_url, list(ids.values()))
    except BaseException as exc:  # no run is left RUNNING in MLflow
        tracker.end_run(parent, status_for(exc))
        raise
    wall_s = time.monotonic() - t0
    progress.update(len(jobs))
    client = ServiceClient(store_url)
    allocations = {r.id: client.store.allocations(r.id) for r in rows}
    capacity = service_gpus(store_url) or 0
    result, specs, started = loop_result_from_store(rows, allocations, capacity, loop_settings)
    recorded = record_service_run(tracker, parent, name, result, specs, rows, int(started * 1000))
    title = f"{Path(jobs_file).name} through the service at {redact_url(store_url)} ({result.capacity} GPU workers)"
    return _published(ClusterOutcome(result, recorded, wall_s, {}, tuple(rows)), title)
