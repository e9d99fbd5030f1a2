"""The end values of a job's MLflow run: the same names for a job of ``malleable run`` (recorded by
``flows.recording.record``) and a job of the service (recorded when the service ends it), so
``malleable compare`` and anyone reading MLflow find one vocabulary.

* ``final_*``: what the trainer measured (steps, samples, loss, eval loss/accuracy and the
  recipe's own eval metrics, mean rescale pause);
* ``jct_s`` (finished jobs), ``queue_delay_s``, ``rescales``, ``gpu_seconds``: the schedule's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from service.store.records import AllocationRow, JobRow, JobState

if TYPE_CHECKING:
    from elastic_tasks.coordinator.outcomes import JobResult

RESIZE_KINDS = ("in_place", "restart")


def final_values(
    steps: int,
    samples_seen: int,
    accuracy: float | None = None,
    eval_loss: float | None = None,
    eval_metrics: Iterable[tuple[str, float]] = (),
    loss: float | None = None,
    rescale_pause_s_mean: float | None = None,
) -> dict[str, float]:
    """Measured end values by name, without the ``final_`` prefix (a recipe metric named like a
    built-in one is overridden by it); a value never measured is left out."""
    values: dict[str, float] = {"steps": float(steps), "samples_seen": float(samples_seen)}
    if accuracy is not None:
        values["accuracy"] = accuracy
    if eval_loss is not None:
        values["eval_loss"] = eval_loss
    values.update({f"eval_{name}": value for name, value in eval_metrics})
    if loss is not None:
        values["loss"] = loss
    if rescale_pause_s_mean is not None:
        values["rescale_pause_s_mean"] = rescale_pause_s_mean
    return values


def mean_rescale_pause_s(result: JobResult) -> float | None:
    """The ranks' measured pause per generation change after the start (None: none measured)."""
    pauses = [o.pause_s for o in result.rescales[1:] if o.pause_s is not None]
    return sum(pauses) / len(pauses) if pauses else None


def result_final_values(result: JobResult) -> dict[str, float]:
    return final_values(
        result.steps, result.samples_seen, result.eval_accuracy, result.eval_loss, result.eval_metrics, result.final_loss, mean_rescale_pause_s(result)
    )


def gpu_seconds(allocations: Sequence[AllocationRow], end: float) -> float:
    """GPUs held integrated over time, from the job's allocation history up to ``end``."""
    total = 0.0
    rows = sorted(allocations, key=lambda r: r.time)
    for row, nxt in zip(rows, [*rows[1:], None]):
        until = end if nxt is None else min(nxt.time, end)
        total += row.gpus * max(0.0, until - row.time)
    return total


def service_job_metrics(row: JobRow, allocations: Sequence[AllocationRow], result: JobResult | None) -> dict[str, float]:
    """What a service job's run gets when the job ends (``row``: the store's row, already terminal)."""
    end = row.finished_at if row.finished_at is not None else row.updated_at
    values: dict[str, float] = {
        "rescales": float(sum(1 for a in allocations if a.kind in RESIZE_KINDS)),
        "gpu_seconds": gpu_seconds(allocations, end),
    }
    if row.state is JobState.FINISHED and row.finished_at is not None:
        values["jct_s"] = row.finished_at - row.submitted_at
    if row.started_at is not None:
        values["queue_delay_s"] = row.started_at - row.submitted_at
    if result is not None:
        values.update({f"final_{k}": v for k, v in result_final_values(result).items()})
    return values
