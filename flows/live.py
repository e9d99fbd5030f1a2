"""A live progress line for a run of the autoscaling loop (``run``, ``quickstart``).

Fed by the loop's observer (``StepReport``): jobs finished of all, elapsed time and an
estimate of what is left, and each running job's GPUs and global batch. Drawn on stderr by
rich, so the tables on stdout stay clean for pipes; on a non-terminal it draws nothing.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from allocator.loop import StepReport


def running_summary(report: StepReport) -> str:
    """``job-a 2 GPU × 128, job-b 1 GPU × 64`` (global batch), or who is waiting."""
    shares = [f"{job} {share.gpus} GPU × {share.batch}" for job, share in report.allocation.shares if share.gpus > 0]
    text = ", ".join(shares) or "no job running"
    if report.queued:
        text += f"; {report.queued} queued"
    return text


class LoopProgress:
    """Context manager and observer: ``with LoopProgress(console) as p: flow(..., on_step=p)``."""

    def __init__(self, console: Console, jobs_total: int | None = None) -> None:
        self._progress = Progress(
            TextColumn("[bold]jobs done"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[running]}"),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task("jobs", total=jobs_total, running="preparing: profile, workers, warm-up…")

    def __enter__(self) -> LoopProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def __call__(self, report: StepReport) -> None:
        self._progress.update(self._task, total=report.jobs_total, completed=report.finished_total, running=running_summary(report))
