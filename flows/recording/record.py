"""Record a finished loop run (simulated or real) in MLflow: parent run, one nested run per job.

The parent holds the run's settings as params, cluster-level metrics over time, the schedule
CSV and the figures; each job's nested run holds its spec as params and its GPUs, global
batch, per-GPU micro-batch, accumulation steps and modelled samples/s as metrics over time
(step = whole seconds since the run began), plus what the executor measured (loss, accuracy,
...) when there is any.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from allocator.loop import JobRecord, LoopResult, LoopSettings
from allocator.metrics import RunMetrics, gpu_seconds_by_job, schedule_csv, summarise
from allocator.physics.throughput import throughput
from allocator.types import JobSpec
from flows.recording.plots import plot_completed, plot_gpus_per_job
from flows.recording.tracking import MetricPoint, Tracker
from service.job_metrics import final_values

if TYPE_CHECKING:
    from flows.recording.live_tracking import LiveRuns


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What a flow reports per job, real or simulated."""

    job_id: str
    arrival_s: float
    start_s: float | None
    finish_s: float | None
    jct_s: float | None
    rescales: int
    final_accuracy: float | None = None
    final_loss: float | None = None
    state: str = "finished"  # finished, failed, cancelled, dropped or unfinished (the run ended first)
    error: str | None = None  # why it failed

    @property
    def ok(self) -> bool:
        return self.state == "finished"


def job_state(record: JobRecord) -> str:
    if record.finish is not None:
        return "finished"
    if record.failed:
        return "failed"
    if record.cancelled:
        return "cancelled"
    return "dropped" if record.dropped else "unfinished"


@dataclass(frozen=True, slots=True)
class MeasuredJob:
    """What the trainer measured for one job of a real run: per-step series and end values."""

    steps: int
    samples_seen: int
    series: tuple[MetricPoint, ...] = ()
    accuracy: float | None = None
    eval_loss: float | None = None
    eval_metrics: tuple[tuple[str, float], ...] = ()  # the recipe's own, logged as eval_<name>
    loss: float | None = None
    rescale_pause_s_mean: float | None = None
    wall_split: tuple[tuple[str, float], ...] = ()  # where its wall time went (allocator.wall_split), logged as wall_<part>

    def final_values(self) -> dict[str, float]:
        """Metric name -> end value, named as a service job's (``service.job_metrics``)."""
        values = final_values(self.steps, self.samples_seen, self.accuracy, self.eval_loss, self.eval_metrics, self.loss, self.rescale_pause_s_mean)
        return values | {f"wall_{k}": v for k, v in self.wall_split}


@dataclass(frozen=True, slots=True)
class RecordedRun:
    parent_run: str
    job_runs: Mapping[str, str]
    metrics: RunMetrics
    outcomes: tuple[JobOutcome, ...]


def job_params(spec: JobSpec) -> dict[str, object]:
    return {
        "workload": spec.workload,
        "total_samples": spec.total_samples,
        "min_batch": spec.min_batch,
        "max_batch": spec.max_batch,
        "max_gpus": spec.max_gpus,
        "min_gpus": spec.min_gpus,
        "elastic": spec.elastic,
        "arrival_s": spec.arrival_time,
        "fixed_batch": spec.fixed_batch,
        "num_params": spec.profile.num_params,
        "hardware": spec.profile.hardware,
    }


def outcomes(result: LoopResult, measured: Mapping[str, MeasuredJob] | None = None) -> tuple[JobOutcome, ...]:
    out = []
    for r in result.jobs:
        rescales = sum(1 for e in result.events if e.job_id == r.job_id and e.kind.value in ("in_place", "restart"))
        m = (measured or {}).get(r.job_id)
        out.append(
            JobOutcome(
                job_id=r.job_id,
                arrival_s=r.arrival,
                start_s=r.start,
                finish_s=r.finish,
                jct_s=None if r.finish is None else r.finish - r.arrival,
                rescales=rescales,
                final_accuracy=None if m is None else m.accuracy,
                final_loss=None if m is None else m.loss,
                state=job_state(r),
                error=r.failed,
            )
        )
    return tuple(out)


def schedule_points(result: LoopResult, spec: JobSpec, start_ms: int) -> list[MetricPoint]:
    """The job's share over time as metrics. A share's batch runs in ``accum_steps`` micro-steps
    per optimizer step, so ``batch_per_gpu`` is the micro-batch a rank holds at once and the
    modelled rate is the throughput model's with those steps (one allreduce per optimizer step)."""
    points = []
    for row in result.schedule:
        if row.job_id != spec.id:
            continue
        step, ts = int(round(row.time)), start_ms + int(row.time * 1000)
        rate = throughput(spec.profile, row.batch, row.gpus, row.accum_steps) if row.gpus > 0 else 0.0
        per_gpu = -(-row.batch // (row.gpus * row.accum_steps)) if row.gpus > 0 else 0
        points += [
            MetricPoint("gpus", row.gpus, step, ts),
            MetricPoint("batch", row.batch, step, ts),
            MetricPoint("batch_per_gpu", per_gpu, step, ts),
            MetricPoint("accum_steps", row.accum_steps if row.gpus > 0 else 0, step, ts),
            MetricPoint("modelled_samples_per_s", rate, step, ts),
        ]
    return points


def _cluster_points(result: LoopResult, start_ms: int) -> list[MetricPoint]:
    points = [MetricPoint("gpus_in_use", g, int(round(t)), start_ms + int(t * 1000)) for t, g in result.gpu_usage]
    finishes = sorted(r.finish for r in result.jobs if r.finish is not None)
    points += [MetricPoint("jobs_completed", i + 1, int(round(t)), start_ms + int(t * 1000)) for i, t in enumerate(finishes)]
    return points


def summary_metrics(m: RunMetrics) -> dict[str, float]:
    values = {
        "jobs_completed": m.jobs_completed,
        "drop_ratio": m.drop_ratio,
        "sjs_efficiency": m.sjs_efficiency,
        "gpu_utilisation": m.gpu_utilisation,
        "rescales": m.rescales,
        "rescale_cost_s": m.rescale_cost_s,
        "makespan_s": m.makespan_s,
        "avg_jct_s": m.avg_jct_s,
        "p95_jct_s": m.p95_jct_s,
        "avg_queue_delay_s": m.avg_queue_delay_s,
    }
    return {k: float(v) for k, v in values.items() if v is not None}


def parent_params(mode: str, policy: str, capacity: int, settings: LoopSettings, jobs: int, extra: Mapping[str, object] | None = None) -> dict[str, object]:
    """The parent run's parameters (known before the loop starts, so a live run logs them first)."""
    return {
        "mode": mode,
        "policy": policy,
        "capacity": capacity,
        "interval_s": settings.interval_s,
        "overflow": settings.overflow.value,
        "react_to_events": settings.react_to_events,
        "jobs": jobs,
        **(extra or {}),
    }


def record_run(
    tracker: Tracker,
    name: str,
    result: LoopResult,
    specs: Mapping[str, JobSpec],
    *,
    mode: str,
    start_ms: int,
    params: Mapping[str, object] | None = None,
    measured: Mapping[str, MeasuredJob] | None = None,
    parent: str | None = None,
    live: LiveRuns | None = None,
    extra_metrics: Mapping[str, float] | None = None,
) -> RecordedRun:
    """Log ``result`` as a parent run with nested job runs; returns their ids (or offline refs).

    ``measured``: what the trainer measured per job (a real run).
    ``live``: runs opened while the loop ran (``flows.recording.live_tracking``); they are completed
    rather than created again. ``extra_metrics``: more summary figures for the parent run (its fairness)."""
    metrics = summarise(result, specs)
    run_params = parent_params(mode, result.policy, result.capacity, result.settings, len(specs), params)
    if live is None:
        parent_run = tracker.start_run(name, parent=parent, params=run_params, tags={"malleable.mode": mode, "malleable.policy": result.policy})
    else:
        parent_run = live.parent_run
    tracker.log_metrics(parent_run, _cluster_points(result, start_ms))
    job_runs: dict[str, str] = {}
    outs = outcomes(result, measured)
    held = gpu_seconds_by_job(result)
    for out in outs:
        spec = specs[out.job_id]
        opened = None if live is None else live.job_runs.get(out.job_id)
        run = opened or tracker.start_run(out.job_id, parent=parent_run, params=job_params(spec), tags={"malleable.mode": mode})
        job_runs[out.job_id] = run
        m = (measured or {}).get(out.job_id)
        points = schedule_points(result, spec, start_ms) + list(() if m is None else m.series)
        final = {"rescales": float(out.rescales), "gpu_seconds": held.get(out.job_id, 0.0)}
        if out.jct_s is not None:
            final["jct_s"] = out.jct_s
        if out.start_s is not None:
            final["queue_delay_s"] = out.start_s - out.arrival_s
        # Measured end values under final_*: "loss" is also the per-step series, and a final
        # value logged into it (at a step that was really a time) would bend its curve.
        if m is not None:
            final.update({f"final_{k}": float(v) for k, v in m.final_values().items()})
        ended_ms = start_ms + int((out.finish_s if out.finish_s is not None else result.end_time) * 1000)
        points += [MetricPoint(k, v, 0, ended_ms) for k, v in final.items()]
        tracker.log_metrics(run, points)
        tracker.end_run(run, "FINISHED" if out.finish_s is not None else "KILLED")
    finish_parent(tracker, parent_run, name, result, metrics, extra=extra_metrics)
    return RecordedRun(parent_run=parent_run, job_runs=job_runs, metrics=metrics, outcomes=outs)


def finish_parent(
    tracker: Tracker, parent_run: str, name: str, result: LoopResult, metrics: RunMetrics, status: str = "FINISHED", extra: Mapping[str, float] | None = None
) -> None:
    """The parent run's summary metrics (what ``malleable compare`` reads), schedule and figures; ended."""
    end = int(round(result.end_time))
    tracker.log_metrics(parent_run, [MetricPoint(k, v, end) for k, v in {**summary_metrics(metrics), **(extra or {})}.items()])
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "schedule.csv").write_text(schedule_csv(result))
        tracker.log_artifact(parent_run, d / "schedule.csv")
        plot_gpus_per_job(result, f"GPUs per job — {name}", d / "gpus-per-job.png")
        plot_batch_per_job(result, f"global batch per job — {name}", d / "batch-per-job.png")
        plot_completed([(result.policy, result)], [r.arrival for r in result.jobs], f"jobs completed — {name}", d / "jobs-completed.png")
        for png in ("gpus-per-job.png", "batch-per-job.png", "jobs-completed.png"):
            tracker.log_figure_file(parent_run, d / png)
    tracker.end_run(parent_run, status)


def plot_batch_per_job(result: LoopResult, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for job in [r.job_id for r in result.jobs]:
        rows = [row for row in result.schedule if row.job_id == job]
        if rows:
            times = [row.time / 60.0 for row in rows] + [result.end_time / 60.0]
            batches = [row.batch for row in rows] + [rows[-1].batch]
            ax.step(times, batches, where="post", label=job)
    ax.set_xlabel("time (min)")
    ax.set_ylabel("global batch")
    ax.set_title(title, fontsize=10)
    if len(result.jobs) <= 12:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
