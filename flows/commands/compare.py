"""``malleable compare``: recorded runs side by side — a rich table and a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.commands.shared.common import settings_or_fail
from flows.recording.comparison import CompareError, Comparison, check_run_ids, check_runs, compare_runs, mixed_models_warning, png_path
from flows.commands.shared.console import console, fail, warn
from flows.config.paths import check_output_file

_FORMATS = {".png", ".pdf", ".svg", ".jpg", ".jpeg"}


def comparison_table(comparison: Comparison) -> Table:
    """One column per run, one row per figure: it reads at 80 columns for a handful of runs,
    where a column per figure cut every heading to one letter."""
    table = Table(title="recorded runs side by side")
    table.add_column("", no_wrap=True, style="bold")
    for r in comparison.runs:
        table.add_column(r.name, justify="right", overflow="fold")
    table.add_row("mode", *(r.mode for r in comparison.runs))
    table.add_row("policy", *(r.policy for r in comparison.runs))
    table.add_row("GPUs", *(r.capacity for r in comparison.runs))
    for key, heading in HEADINGS.items():
        table.add_row(heading, *(_fmt(r.value(key)) for r in comparison.runs))
    return table


# The columns that fit a terminal; every summary metric is in MLflow and the flow's artifact.
HEADINGS = {
    "jobs_completed": "jobs done",
    "avg_jct_s": "avg JCT s",
    "p95_jct_s": "p95 JCT s",
    "gpu_utilisation": "GPU utilisation",
    "rescales": "rescales",
    "makespan_s": "makespan s",
}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def compare(
    run_ids: Annotated[list[str] | None, typer.Argument(help="MLflow parent run ids (default: the latest --last runs).")] = None,
    last: Annotated[int, typer.Option("--last", "-n", help="How many of the latest runs, when no ids are given.")] = 2,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the PNG.")] = Path("out/compare.png"),
    jobs: Annotated[list[str] | None, typer.Option("--jobs", help="Service jobs by id or name, comma-separated; one column per --jobs.")] = None,
    submitter: Annotated[list[str] | None, typer.Option("--submitter", help="Service jobs of a submitter: as `malleable jobs` shows it, or its name alone ('alice' for 'alice (alice@laptop)'); one column each.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Service jobs submitted since: 30m, 2h, 1d ago or a date/time.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Service jobs submitted before: a duration ago or a date/time.")] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", "-e", help="MLflow experiment to look in (default MALLEABLE_EXPERIMENT).")] = None,
) -> None:
    """Compare recorded runs (e.g. elastic vs fixed on one trace) and jobs of a running service: table and plot."""
    from flows.recording.service_selection import parse_when

    settings_or_fail()
    if last < 1:
        fail(f"last={last}: must be >= 1")
    try:
        check_run_ids(run_ids or [])
        if out.is_dir():
            raise ValueError(f"--out={str(out)!r}: is a directory; give the plot's file name (e.g. {str(out / 'compare.png')!r})")
        if png_path(out).suffix.lower() not in _FORMATS:
            raise ValueError(f"--out={str(out)!r}: the plot is written as {', '.join(sorted(_FORMATS))}; give one of those suffixes")
        check_output_file(png_path(out), "--out")
        window = (parse_when(since, "--since") if since else None, parse_when(until, "--until") if until else None)
        selections = service_selections(jobs or [], submitter or [], *window, since, until)
    except ValueError as exc:
        fail(str(exc))
    try:
        check_runs(run_ids or [], experiment)
        comparison = compare_runs(run_ids or [], last, out, selections, experiment)  # read-only: no flow run, no Prefect server
    except CompareError as exc:
        fail(str(exc), code=1)
    for line in comparison.found:
        console.print(line, highlight=False, markup=False)
    console.print(comparison_table(comparison))
    warning = mixed_models_warning(comparison.runs)
    if warning:
        warn(warning)
    console.print(f"plot written to [bold]{comparison.png}[/]")


def service_selections(jobs: list[str], submitters: list[str], since_s: float | None, until_s: float | None, since: str | None, until: str | None):
    """One selection per --jobs and per --submitter; a window alone selects every service job in it."""
    from flows.recording.service_selection import Selection
    from service.jobs.limits import MAX_TEXT, quoted

    for flag, values in (("--jobs", jobs), ("--submitter", submitters)):
        for value in values:  # the limits of the store's names: a control sequence never reaches a table or the terminal
            if len(value) > MAX_TEXT * 64 or any(not c.isprintable() for c in value):
                raise ValueError(f"--{flag.lstrip('-')}={quoted(value)}: must be printable text (no newlines, escapes or control characters), at most {MAX_TEXT * 64:,} characters")
    window = " ".join(filter(None, [f"since {since}" if since else "", f"until {until}" if until else ""]))
    label = lambda base: f"{base} {window}".strip()  # noqa: E731
    out = []
    for group in jobs:
        ids = tuple(j.strip() for j in group.split(",") if j.strip())
        if not ids:
            raise ValueError(f"--jobs={group!r}: name at least one job id")
        if any(len(i) > MAX_TEXT for i in ids):
            raise ValueError(f"--jobs={quoted(group)}: a job id or name is at most {MAX_TEXT} characters")
        out.append(Selection(label(f"jobs {','.join(ids)}"), job_ids=ids, since=since_s, until=until_s))
    for who in submitters:
        if not who.strip() or "'" in who or len(who) > MAX_TEXT:
            raise ValueError(f"--submitter={who!r}: a submitter as `malleable jobs` shows it (no quotes)")
        out.append(Selection(label(f"jobs of {who}"), submitter=who, since=since_s, until=until_s))
    if not out and (since_s is not None or until_s is not None):
        out.append(Selection(label("service jobs"), since=since_s, until=until_s))
    return out
