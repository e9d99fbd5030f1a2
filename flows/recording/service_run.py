"""A run whose jobs a running service scheduled, recorded like any other run.

The cluster flow that submits to a team's service does not run the loop itself, but the store
holds everything the loop would have reported: when each job was submitted, started and
ended, why it failed, and every allocation the service gave it. ``loop_result_from_store``
turns that into the loop's own ``LoopResult`` (times in seconds from the run's first
submission, jobs under the names they were submitted with), so the run gets the parent run,
summary metrics, schedule and figures of ``malleable run`` (``record.finish_parent``) and the
same Prefect artifacts, and ``malleable compare`` puts it beside any other run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from allocator.allocation import Share
from allocator.loop import JobRecord, LoopResult, LoopSettings, ScheduleRow
from allocator.metrics import summarise
from allocator.types import JobSpec, RescaleEvent, RescaleKind
from flows.recording.record import RecordedRun, finish_parent, outcomes
from flows.recording.tracking import MetricPoint, Tracker
from service.store.records import AllocationRow, JobRow, JobState


def _share(gpus: int, batch: int) -> Share | None:
    return Share(gpus, max(batch, gpus)) if gpus > 0 else None


def loop_result_from_store(
    rows: Sequence[JobRow], allocations: Mapping[str, Sequence[AllocationRow]], capacity: int, settings: LoopSettings, policy: str = "service"
) -> tuple[LoopResult, dict[str, JobSpec], float]:
    """(the run as the loop reports one, its jobs by name, the run's t = 0 as an epoch time).

    ``allocations``: each job's allocation history by store id (``JobStore.allocations``).
    ``capacity``: the service's GPU workers, when known (0: not known). It is the run's size even
    where the rows briefly add up to more: a row is stamped when the loop records it, so a job's
    end (stamped when the loop reaps it) or a shrink a lost rank forced (never a row) can read as
    later than the moment its workers went to another job. Only an unknown size is read off the
    rows' peak."""
    t0 = min(r.submitted_at for r in rows)
    specs = {r.name: dataclasses.replace(r.job_spec(), id=r.name, arrival_time=r.submitted_at - t0) for r in rows}
    schedule: list[ScheduleRow] = []
    events: list[RescaleEvent] = []
    records: list[JobRecord] = []
    for r in rows:
        before: Share | None = None
        for a in sorted(allocations.get(r.id, ()), key=lambda a: a.time):
            schedule.append(ScheduleRow(a.time - t0, r.name, a.gpus, a.batch if a.gpus else 0))
            after = _share(a.gpus, a.batch)
            if before is not None or after is not None:
                events.append(RescaleEvent(max(0.0, a.time - t0), r.name, before, after, RescaleKind(a.kind), None, measured=True))
            before = after
        if r.state.terminal and r.finished_at is not None and before is not None:
            schedule.append(ScheduleRow(r.finished_at - t0, r.name, 0, 0))  # its GPUs are free at once, as in the loop
        finished = r.state is JobState.FINISHED and r.finished_at is not None
        records.append(
            JobRecord(
                job_id=r.name,
                arrival=r.submitted_at - t0,
                start=None if r.started_at is None else r.started_at - t0,
                finish=r.finished_at - t0 if finished else None,
                dropped=r.state is JobState.DROPPED,
                samples_done=float(r.total_samples) if finished else r.samples_done,
                failed=(r.error or "failed").removeprefix(f"job {r.id}: ") if r.state is JobState.FAILED else None,
                cancelled=r.state is JobState.CANCELLED,
            )
        )
    schedule.sort(key=lambda s: (s.time, s.job_id))
    end = max([r.finished_at or r.updated_at for r in rows]) - t0
    return (
        LoopResult(
            policy=policy,
            capacity=capacity if capacity > 0 else _peak(schedule),
            settings=settings,
            end_time=max(0.0, end),
            schedule=tuple(schedule),
            events=tuple(sorted(events, key=lambda e: e.time)),
            jobs=tuple(sorted(records, key=lambda j: (j.arrival, j.job_id))),
            gpu_usage=_usage(schedule),
            decisions=0,
        ),
        specs,
        t0,
    )


def _usage(schedule: Sequence[ScheduleRow]) -> tuple[tuple[float, int], ...]:
    """GPUs in use by these jobs over time, one point per change."""
    current: dict[str, int] = {}
    usage: list[tuple[float, int]] = []
    for row in schedule:
        current[row.job_id] = row.gpus
        total = sum(current.values())
        if usage and usage[-1][0] == row.time:
            usage[-1] = (row.time, total)
        else:
            usage.append((row.time, total))
    return tuple(usage)


def _peak(schedule: Sequence[ScheduleRow]) -> int:
    return max((g for _, g in _usage(schedule)), default=0)


def record_service_run(
    tracker: Tracker, parent_run: str, name: str, result: LoopResult, specs: Mapping[str, JobSpec], rows: Sequence[JobRow], start_ms: int
) -> RecordedRun:
    """Fill in and end the flow's parent run (opened before submitting, so the service nested each
    job's run under it); the job runs themselves the service recorded and ended."""
    metrics = summarise(result, specs)
    tracker.log_params(parent_run, {"capacity": result.capacity, "policy": result.policy})
    points = [MetricPoint("gpus_in_use", g, int(round(t)), start_ms + int(t * 1000)) for t, g in result.gpu_usage]
    finishes = sorted(r.finish for r in result.jobs if r.finish is not None)
    points += [MetricPoint("jobs_completed", i + 1, int(round(t)), start_ms + int(t * 1000)) for i, t in enumerate(finishes)]
    tracker.log_metrics(parent_run, points)
    outs = outcomes(result)
    finish_parent(tracker, parent_run, name, result, metrics, status="FINISHED" if all(o.ok for o in outs) else "FAILED")
    job_runs = {r.name: r.mlflow_run_id for r in rows if r.mlflow_run_id}
    return RecordedRun(parent_run=parent_run, job_runs=job_runs, metrics=metrics, outcomes=outs)
