"""PNG figures for runs: jobs completed over time (seed 000 Figs. 6/7/9 style), GPUs per job."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from allocator.loop import LoopResult  # noqa: E402
from allocator.metrics import completed_over_time  # noqa: E402


def plot_completed(runs: Sequence[tuple[str, LoopResult]], arrivals_s: Sequence[float], title: str, path: Path) -> Path:
    """One line per labelled run, plus the cumulative arrivals, minutes on the x axis."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    arr = np.sort(np.asarray(arrivals_s, dtype=float)) / 60.0
    ax.step(arr, np.arange(1, len(arr) + 1), where="post", color="grey", linestyle="--", label="job arrival")
    for label, result in runs:
        times, counts = completed_over_time(result)
        ax.step(times / 60.0, counts, where="post", label=label)
    ax.set_xlabel("time (min)")
    ax.set_ylabel("total jobs completed")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gpus_per_job(result: LoopResult, title: str, path: Path, max_jobs: int = 40) -> Path:
    """Stacked GPUs per job over time (the first ``max_jobs`` jobs by arrival; the rest as 'other')."""
    order = [r.job_id for r in result.jobs][:max_jobs]
    times = sorted({row.time for row in result.schedule} | {result.end_time})
    current: dict[str, int] = {}
    series = {j: [] for j in order}
    other = []
    rows = sorted(result.schedule, key=lambda r: r.time)
    i = 0
    for t in times:
        while i < len(rows) and rows[i].time <= t:
            current[rows[i].job_id] = rows[i].gpus
            i += 1
        for j in order:
            series[j].append(current.get(j, 0))
        other.append(sum(g for j, g in current.items() if j not in series))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    t_min = np.asarray(times) / 60.0
    stacks = [series[j] for j in order] + ([other] if any(other) else [])
    labels = order + (["other"] if any(other) else [])
    ax.stackplot(t_min, *stacks, labels=labels, step="post")
    ax.set_xlabel("time (min)")
    ax.set_ylabel("GPUs")
    ax.set_ylim(0, result.capacity)
    ax.set_title(title, fontsize=10)
    if len(labels) <= 12:
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
