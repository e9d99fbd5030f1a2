"""One job's per-step curve: MLflow points, a CSV, a PNG and a terminal sparkline.

The step history itself is ``JobResult.history`` (``StepRecord`` per step: loss, the LR of
each parameter group, GPUs, global batch, wall time) and ``JobResult.evals``; this module
only turns it into the forms people look at.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elastic_tasks.protocol import EvalResult, StepRecord
    from flows.recording.tracking import MetricPoint

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """``values`` as one line of block characters, averaged into at most ``width`` cells."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    cells = min(width, len(values))
    means = []
    for c in range(cells):
        chunk = [v for v in values[c * len(values) // cells : (c + 1) * len(values) // cells] if math.isfinite(v)]
        means.append(sum(chunk) / len(chunk) if chunk else math.nan)
    lo, hi = min(finite), max(finite)
    span = hi - lo
    return "".join(" " if not math.isfinite(m) else _BARS[0 if span == 0 else min(len(_BARS) - 1, int((m - lo) / span * len(_BARS)))] for m in means)


def samples_per_s(record: StepRecord) -> float | None:
    return record.global_batch / record.wall_s if record.wall_s > 0 else None


def group_lrs(record: StepRecord) -> tuple[float, ...]:
    return record.group_lrs or (record.lr,)


def history_points(history: Sequence[StepRecord], evals: Sequence[EvalResult] = ()) -> list[MetricPoint]:
    """Per step: loss, lr (and lr_group_<i> when there are several groups), gpus, batch,
    samples_per_s; per evaluation: eval_<metric> at its step."""
    from flows.recording.tracking import MetricPoint

    points: list[MetricPoint] = []
    for rec in history:
        points += [MetricPoint("loss", rec.loss, rec.step), MetricPoint("lr", rec.lr, rec.step)]
        lrs = group_lrs(rec)
        if len(lrs) > 1:
            points += [MetricPoint(f"lr_group_{i}", lr, rec.step) for i, lr in enumerate(lrs)]
        points += [MetricPoint("gpus", rec.world_size, rec.step), MetricPoint("batch", rec.global_batch, rec.step)]
        if (rate := samples_per_s(rec)) is not None:
            points.append(MetricPoint("samples_per_s", rate, rec.step))
    for ev in evals:
        points += eval_points(ev)
    return points


def eval_points(ev: EvalResult) -> list[MetricPoint]:
    from flows.recording.tracking import MetricPoint

    step = ev.step or 0
    values = dict(ev.metrics) | ({} if ev.loss is None else {"loss": ev.loss})
    if ev.accuracy is not None:
        values["accuracy"] = ev.accuracy
    return [MetricPoint(f"eval_{name}", value, step) for name, value in sorted(values.items())]


def write_history_csv(history: Sequence[StepRecord], path: Path) -> Path:
    """One row per step: step, loss, the LR of each group, GPUs, global batch, samples/s, wall seconds."""
    groups = max((len(group_lrs(r)) for r in history), default=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["step", "loss", *(f"lr_group_{i}" for i in range(groups)), "gpus", "global_batch", "samples_per_s", "wall_s"])
        for rec in history:
            lrs = list(group_lrs(rec)) + [""] * (groups - len(group_lrs(rec)))
            rate = samples_per_s(rec)
            out.writerow([rec.step, rec.loss, *lrs, rec.world_size, rec.global_batch, "" if rate is None else rate, rec.wall_s])
    return path


def plot_step_curve(history: Sequence[StepRecord], evals: Sequence[EvalResult], title: str, path: Path) -> Path:
    """Loss (and eval loss) over steps above the LR of each parameter group; GPU changes marked."""
    import matplotlib  # here: the CLI's summary line needs only the sparkline

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    steps = [r.step for r in history]
    top.plot(steps, [r.loss for r in history], label="training loss", lw=1)
    evaluated = [e for e in evals if e.loss is not None and e.step is not None]
    if evaluated:
        top.plot([e.step for e in evaluated], [e.loss for e in evaluated], "o-", label="eval loss")
    top.set_ylabel("loss")
    groups = max((len(group_lrs(r)) for r in history), default=1)
    for g in range(groups):
        bottom.plot(steps, [group_lrs(r)[g] if g < len(group_lrs(r)) else math.nan for r in history], label=f"group {g}" if groups > 1 else "lr")
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel("step")
    for prev, rec in zip(history, history[1:]):
        if rec.world_size != prev.world_size:
            for ax in (top, bottom):
                ax.axvline(rec.step, color="grey", ls=":", lw=1)
            top.annotate(f"{rec.world_size} GPUs", (rec.step, 1), xycoords=("data", "axes fraction"), fontsize=7, va="top")
    top.set_title(title, fontsize=10)
    for ax in (top, bottom):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
