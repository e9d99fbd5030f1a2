"""Run metrics: seed 000's SJS efficiency and drop ratio, JCT, queueing, utilisation, rescales.

SJS efficiency = Opt Sch Time / Act Sch Time, where Opt Sch Time is the single-GPU time of
the work scheduled (at each job's largest batch, seed 000's job length) and Act Sch Time the
GPU-seconds actually held. Work is counted in samples processed, so jobs cut off by a
horizon count for what they did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from allocator.loop import LoopResult, ScheduleRow
from allocator.physics.throughput import baseline_rate
from allocator.types import JobSpec, RescaleKind


@dataclass(frozen=True, slots=True)
class RunMetrics:
    policy: str
    jobs_total: int
    jobs_completed: int
    jobs_dropped: int
    drop_ratio: float
    sjs_efficiency: float
    opt_sch_gpu_s: float
    act_sch_gpu_s: float
    avg_jct_s: float | None
    p95_jct_s: float | None
    avg_queue_delay_s: float | None
    gpu_utilisation: float
    rescales: int
    rescale_cost_s: float
    makespan_s: float
    batch_changes: int = 0  # same GPUs, another batch: not a rescale (no regroup)
    batch_change_cost_s: float = 0.0


def gpu_seconds_by_job(result: LoopResult) -> dict[str, float]:
    """Integrate each job's GPUs over time from the schedule's step function."""
    held: dict[str, tuple[float, int]] = {}
    total: dict[str, float] = {}
    for row in result.schedule:
        if row.job_id in held:
            since, gpus = held[row.job_id]
            total[row.job_id] = total.get(row.job_id, 0.0) + gpus * (row.time - since)
        held[row.job_id] = (row.time, row.gpus)
    for job_id, (since, gpus) in held.items():
        total[job_id] = total.get(job_id, 0.0) + gpus * max(0.0, result.end_time - since)
    return total


def utilisation(result: LoopResult, until: float | None = None) -> float:
    """Mean fraction of GPUs in use from time 0 to ``until`` (default: the end of the run)."""
    end = result.end_time if until is None else until
    if end <= 0 or result.capacity == 0:
        return 0.0
    area, points = 0.0, list(result.gpu_usage)
    for (t0, g), (t1, _) in zip(points, points[1:] + [(end, 0)]):
        area += g * max(0.0, min(t1, end) - min(t0, end))
    return area / (end * result.capacity)


def completed_over_time(result: LoopResult) -> tuple[np.ndarray, np.ndarray]:
    """(times, cumulative jobs completed) — the seed's Fig. 6/7/9 curves."""
    times = np.sort(np.array([r.finish for r in result.jobs if r.finish is not None], dtype=float))
    return times, np.arange(1, len(times) + 1)


def summarise(result: LoopResult, specs: Mapping[str, JobSpec]) -> RunMetrics:
    records = result.jobs
    finished = [r for r in records if r.finish is not None]
    jct = np.array([r.finish - r.arrival for r in finished], dtype=float)
    delays = np.array([r.start - r.arrival for r in records if r.start is not None], dtype=float)
    opt = sum(r.samples_done / baseline_rate(specs[r.job_id]) for r in records if r.start is not None)
    act = sum(gpu_seconds_by_job(result).values())
    resizes = [e for e in result.events if e.kind in (RescaleKind.IN_PLACE, RescaleKind.RESTART)]
    batch_only = [e for e in result.events if e.kind is RescaleKind.BATCH]
    dropped = sum(r.dropped for r in records)
    return RunMetrics(
        policy=result.policy,
        jobs_total=len(records),
        jobs_completed=len(finished),
        jobs_dropped=dropped,
        drop_ratio=dropped / len(records) if records else 0.0,
        sjs_efficiency=opt / act if act > 0 else 0.0,
        opt_sch_gpu_s=opt,
        act_sch_gpu_s=act,
        avg_jct_s=float(jct.mean()) if jct.size else None,
        p95_jct_s=float(np.percentile(jct, 95)) if jct.size else None,
        avg_queue_delay_s=float(delays.mean()) if delays.size else None,
        gpu_utilisation=utilisation(result),
        rescales=len(resizes),
        rescale_cost_s=float(sum(e.cost_s for e in resizes if e.cost_s is not None)),
        makespan_s=result.end_time,
        batch_changes=len(batch_only),
        batch_change_cost_s=float(sum(e.cost_s for e in batch_only if e.cost_s is not None)),
    )


SCHEDULE_COLUMNS = ("time_s", "job", "gpus", "batch", "accum_steps")


def schedule_csv(result: LoopResult) -> str:
    """The per-job schedule as CSV text: time_s, job, gpus, batch, accum_steps. Byte-stable for a given run."""
    lines = [",".join(SCHEDULE_COLUMNS)]
    lines += [f"{row.time:.6f},{row.job_id},{row.gpus},{row.batch},{row.accum_steps}" for row in result.schedule]
    return "\n".join(lines) + "\n"


def read_schedule_csv(text: str) -> tuple[ScheduleRow, ...]:
    """Rows of a ``schedule_csv`` file; one written before ``accum_steps`` existed reads as 1 step."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("schedule CSV: empty (expected a header line)")
    header = tuple(lines[0].split(","))
    if header not in (SCHEDULE_COLUMNS, SCHEDULE_COLUMNS[:4]):
        raise ValueError(f"schedule CSV header={lines[0]!r}: expected {','.join(SCHEDULE_COLUMNS)} (accum_steps optional)")
    rows = []
    for number, line in enumerate(lines[1:], start=1):
        fields = line.split(",")
        if len(fields) != len(header):
            raise ValueError(f"schedule CSV row {number}={line!r}: expected {len(header)} fields")
        try:
            accum = int(fields[4]) if len(fields) == 5 else 1
            rows.append(ScheduleRow(float(fields[0]), fields[1], int(fields[2]), int(fields[3]), accum))
        except ValueError:
            raise ValueError(f"schedule CSV row {number}={line!r}: time must be a number, gpus/batch/accum_steps integers") from None
    return tuple(rows)
