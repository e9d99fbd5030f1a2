"""Tables two CLI commands print: a run's per-job outcomes, the service's jobs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from service.display import shown

if TYPE_CHECKING:
    from flows.recording.record import JobOutcome


def outcome_table(title: str, outs: tuple[JobOutcome, ...]) -> Table:
    table = Table(title=title)
    table.add_column("job", no_wrap=True)
    for col in ("arrival s", "start s", "finish s", "JCT s", "rescales", "final accuracy"):
        table.add_column(col, justify="right")
    for o in outs:
        table.add_row(
            o.job_id,
            f"{o.arrival_s:.1f}",
            "-" if o.start_s is None else f"{o.start_s:.1f}",
            "-" if o.finish_s is None else f"{o.finish_s:.1f}",
            "-" if o.jct_s is None else f"{o.jct_s:.1f}",
            str(o.rescales),
            "-" if o.final_accuracy is None else f"{o.final_accuracy:.3f}",
        )
    return table


def _eta(row) -> str:
    if row.state.value != "running" or not row.started_at or row.samples_done <= 0:
        return "-"
    rate = row.samples_done / max(1e-9, time.time() - row.started_at)
    return f"{(row.total_samples - row.samples_done) / rate:.0f}s" if rate > 0 else "-"


def jobs_table(rows):
    table = Table(box=None, pad_edge=False)
    for col, just in (("id", "left"), ("name", "left"), ("submitter", "left"), ("state", "left"), ("gpus", "right"), ("batch", "right"), ("progress", "right"), ("eta", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    for r in rows:
        # A name is a submitter's free text: control characters escaped, no rich markup, bounded.
        table.add_row(r.id, Text(shown(r.name, 24)), Text(shown(r.submitter, 32)), r.state.value, str(r.gpus), str(r.batch), f"{100 * r.progress:.0f}%", _eta(r))
    return table


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def generations_table(job_id: str, allocations) -> Table:
    """One job's generations: when, GPUs x batch, how, and the samples/s predicted when decided vs measured."""
    table = Table(title=f"{job_id}: generations", box=None, pad_edge=False)
    for col in ("time", "gpus", "batch", "kind", "predicted samples/s", "measured samples/s"):
        table.add_column(col, justify="left" if col in ("time", "kind") else "right", no_wrap=True)
    for a in allocations:
        if a.gpus == 0:
            continue
        table.add_row(time.strftime("%H:%M:%S", time.localtime(a.time)), str(a.gpus), str(a.batch), a.kind, _rate(a.predicted_samples_per_s), _rate(a.measured_samples_per_s))
    return table
