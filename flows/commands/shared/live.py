"""Live progress lines: a run of the autoscaling loop (``run``, ``quickstart``), one job (``train``).

Fed by the loop's observer (``StepReport``): jobs finished of all, elapsed time and an
estimate of what is left, and each running job's GPUs and global batch. Drawn on stderr by
rich, so the tables on stdout stay clean for pipes; on a non-terminal it draws nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from allocator.loop import StepReport

if TYPE_CHECKING:
    from elastic_tasks.board import JobStatus
    from elastic_tasks.protocol import EvalResult


def running_summary(report: StepReport) -> str:
    """``job-a 2 GPU × 128, job-b 1 GPU × 64`` (global batch), or who is waiting."""
    shares = [f"{job} {share.gpus} GPU × {share.global_batch}" for job, share in report.allocation.shares if share.gpus > 0]
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


def step_line(status: JobStatus, samples_per_s: float | None) -> str:
    """``loss 0.8123 · lr 3.2e-03 · 1,234 samples/s · 3 GPU × 32``: one job's latest step."""
    parts = [f"loss {status.loss:.4f}"]
    if status.lr is not None:
        parts.append(f"lr {status.lr:.3g}")
    if samples_per_s is not None:
        parts.append(f"{samples_per_s:,.0f} samples/s")
    parts.append(f"{status.world_size} GPU × {status.global_batch}")
    return " · ".join(parts)


def eval_line(result: EvalResult) -> str:
    """``eval at step 20: loss 0.681, macro_f1 0.5704``."""
    values = ({} if result.loss is None else {"loss": result.loss}) | dict(result.metrics)
    return f"eval at step {result.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in values.items())


class StepProgress:
    """A live line for one job (``malleable train``): steps done of all, ETA, then step, loss,
    LR, samples/s, GPUs and global batch of the latest step.

    ``status`` is polled from a thread (``JobCoordinator.status``: rank 0's latest report).
    On a terminal the line redraws in place; elsewhere (a pipe, CI logs) a plain line is
    printed at most every ``print_every_s`` seconds. Each new periodic evaluation is printed once
    and handed to ``on_eval`` (MLflow logs it live)."""

    def __init__(
        self,
        console: Console,
        total_steps: int | None,
        status: Callable[[], JobStatus | None],
        every_s: float = 0.5,
        on_eval: Callable[[EvalResult], None] | None = None,
        print_every_s: float = 2.0,
    ) -> None:
        self._print_every_s = print_every_s
        self._printed_at = -math.inf
        self._status = status
        self._every_s = every_s
        self._on_eval = on_eval
        self._console = console
        self._total = total_steps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._progress = Progress(
            TextColumn("[bold]step"),
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
        self._previous: JobStatus | None = None
        self._rate: float | None = None
        self._evals_seen: set[int | None] = set()

    def __enter__(self) -> StepProgress:
        self._progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._print_every_s = 0.0  # the last status is always shown, even right after another
        self._poll_once()
        self._progress.stop()

    def _poll(self) -> None:
        while not self._stop.wait(self._every_s):
            if not self._poll_once():
                return

    def _poll_once(self) -> bool:
        try:
            s = self._status()
        except Exception:  # the scheduler is going away at the end of the run
            return False
        if s is not None:
            self.show(s)
        return True

    def show(self, s: JobStatus) -> None:
        """Draw (or print) the line for status ``s``; report a new evaluation once."""
        previous = self._previous
        if previous is not None and s.step > previous.step and s.time > previous.time:
            self._rate = (s.samples_seen - previous.samples_seen) / (s.time - previous.time)
        if previous is None or s.step != previous.step:
            self._previous = s
            detail = step_line(s, self._rate)
            self._progress.update(self._task, completed=s.step, detail=detail)
            if not self._console.is_terminal and time.monotonic() - self._printed_at >= self._print_every_s:
                self._printed_at = time.monotonic()
                total = f"/{self._total}" if self._total else ""
                self._console.print(f"step {s.step}{total} · {detail}", markup=False, highlight=False)
        for result in s.recent_evals:
            if result.step in self._evals_seen:
                continue
            self._evals_seen.add(result.step)
            self._console.print(eval_line(result), markup=False, highlight=False)
            if self._on_eval is not None:
                self._on_eval(result)
