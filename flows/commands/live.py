"""Live progress lines: a run of the autoscaling loop (``run``, ``quickstart``), one job (``train``).

Fed by the loop's observer (``StepReport``): jobs finished of all, elapsed time and an
estimate of what is left, and each running job's GPUs and global batch. Drawn on stderr by
rich, so the tables on stdout stay clean for pipes; on a non-terminal it draws nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from allocator.loop import StepReport

if TYPE_CHECKING:
    from elastic_tasks.board import JobStatus


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


class StepProgress:
    """A live line for one job (``malleable train``): steps done of all, ETA, GPUs, batch, loss.

    ``status`` is polled from a thread (``JobCoordinator.status``: rank 0's latest report)."""

    def __init__(self, console: Console, total_steps: int | None, status: Callable[[], JobStatus | None], every_s: float = 0.5) -> None:
        self._status = status
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._progress = Progress(
            TextColumn("[bold]steps"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task("steps", total=total_steps, detail="starting ranks…")

    def __enter__(self) -> StepProgress:
        self._progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._progress.stop()

    def _poll(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                s = self._status()
            except Exception:  # the scheduler is going away at the end of the run
                return
            if s is not None:
                detail = f"{s.world_size} GPU × {s.global_batch}, loss {s.loss:.4f}"
                self._progress.update(self._task, completed=s.step, detail=detail)
