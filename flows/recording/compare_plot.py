"""The ``malleable compare`` figure: per-job JCT, makespan and GPU utilisation, runs side by side.

Readable at a glance: 14 x 5.5 inches at 130 dpi (1820 x 715 px), times in seconds when the
longest is under two minutes (else minutes), the legend below the axes (never over a bar), and
each run's makespan and utilisation written on its bar.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

if TYPE_CHECKING:
    from flows.recording.comparison import ComparedRun

SIZE_IN, DPI = (14.0, 5.5), 130


def time_unit(seconds: Sequence[float]) -> tuple[str, float]:
    """(label, divisor): seconds while the longest time is under 2 minutes, else minutes."""
    longest = max((s for s in seconds if s is not None and s == s), default=0.0)
    return ("s", 1.0) if longest < 120 else ("min", 60.0)


def plot_comparison(runs: Sequence[ComparedRun], path: Path) -> Path:
    jobs = sorted({j for r in runs for j, _ in r.job_jct_s})
    times = [v for r in runs for _, v in r.job_jct_s if v is not None] + [r.value("makespan_s") for r in runs if r.value("makespan_s") is not None]
    unit, div = time_unit(times)
    fig, (ax_jct, ax_span, ax_util) = plt.subplots(1, 3, figsize=SIZE_IN, gridspec_kw={"width_ratios": [3, 1, 1]})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(1, len(runs))
    x = np.arange(len(jobs))
    for i, run in enumerate(runs):
        jct = dict(run.job_jct_s)
        heights = [np.nan if jct.get(j) is None else jct[j] / div for j in jobs]
        ax_jct.bar(x + (i - (len(runs) - 1) / 2) * width, heights, width, color=colours[i % len(colours)], label=f"{run.name} ({run.mode}, {run.policy})")
    ax_jct.set_xticks(x, jobs, rotation=30 if len(jobs) > 6 else 0, ha="right" if len(jobs) > 6 else "center", fontsize=10)
    ax_jct.set_ylabel(f"job completion time ({unit})", fontsize=11)
    ax_jct.set_title("JCT per job", fontsize=12)
    ax_jct.grid(axis="y", alpha=0.3)
    names = [r.name for r in runs]
    spans = [np.nan if r.value("makespan_s") is None else r.value("makespan_s") / div for r in runs]
    utils = [np.nan if r.value("gpu_utilisation") is None else 100.0 * r.value("gpu_utilisation") for r in runs]
    pos = np.arange(len(runs))
    for ax, values, title, label, fmt in (
        (ax_span, spans, "makespan", unit, "{:.0f}" if unit == "s" else "{:.1f}"),
        (ax_util, utils, "GPU utilisation", "%", "{:.0f}%"),
    ):
        bars = ax.bar(pos, values, 0.6, color=[colours[i % len(colours)] for i in range(len(runs))])
        ax.bar_label(bars, labels=["-" if v != v else fmt.format(v) for v in values], fontsize=10, padding=2)
        ax.set_xticks(pos, names, rotation=30 if len(runs) > 2 else 0, ha="right" if len(runs) > 2 else "center", fontsize=10)
        ax.set_title(title, fontsize=12)
        ax.set_ylabel(label, fontsize=11)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.15)
    ax_util.set_ylim(0, 110)
    fig.legend(*ax_jct.get_legend_handles_labels(), loc="lower center", ncol=min(4, max(1, len(runs))), fontsize=10, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    path = png_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def png_path(path: Path) -> Path:
    """Where the plot really goes: matplotlib adds ``.png`` to a name without a suffix."""
    return path if path.suffix else path.with_suffix(".png")
