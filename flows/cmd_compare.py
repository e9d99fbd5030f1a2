"""``malleable compare``: recorded runs side by side — a rich table and a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from flows.cli_common import prefect_state_or_fail, settings_or_fail
from flows.console import console, fail
from flows.paths import check_output_file

if TYPE_CHECKING:
    from flows.compare_flow import Comparison

_FORMATS = {".png", ".pdf", ".svg", ".jpg", ".jpeg"}


def comparison_table(comparison: Comparison) -> Table:
    table = Table(title="recorded runs side by side")
    for col in ("run", "mode", "policy"):
        table.add_column(col, no_wrap=True)
    for col in ("GPUs", *HEADINGS.values()):
        table.add_column(col, justify="right")
    for r in comparison.runs:
        table.add_row(r.name, r.mode, r.policy, r.capacity, *(_fmt(r.value(k)) for k in HEADINGS))
    return table


# The columns that fit a terminal; every summary metric is in MLflow and the flow's artifact.
HEADINGS = {"jobs_completed": "done", "avg_jct_s": "avg JCT s", "p95_jct_s": "p95 JCT s", "gpu_utilisation": "util", "rescales": "rescales", "makespan_s": "makespan s"}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def compare(
    run_ids: Annotated[list[str] | None, typer.Argument(help="MLflow parent run ids (default: the latest --last runs).")] = None,
    last: Annotated[int, typer.Option("--last", "-n", help="How many of the latest runs, when no ids are given.")] = 2,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the PNG.")] = Path("out/compare.png"),
) -> None:
    """Compare recorded runs (e.g. elastic vs fixed on one trace): table and per-job JCT plot."""
    settings_or_fail()  # before prefect is imported: it reads .env too, and a binary one breaks its import
    # Imported here: prefect, mlflow and matplotlib load only once the settings are known good.
    from flows.compare_flow import CompareError, check_run_ids, check_runs, compare_flow, png_path

    if last < 1:
        fail(f"last={last}: must be >= 1")
    try:
        check_run_ids(run_ids or [])
        if png_path(out).suffix.lower() not in _FORMATS:
            raise ValueError(f"--out={str(out)!r}: the plot is written as {', '.join(sorted(_FORMATS))}; give one of those suffixes")
        check_output_file(png_path(out), "--out")
    except ValueError as exc:
        fail(str(exc))
    prefect_state_or_fail()
    try:
        check_runs(run_ids or [])
        comparison = compare_flow(run_ids=run_ids or None, last=last, out=str(out))
    except CompareError as exc:
        fail(str(exc), code=1)
    console.print(comparison_table(comparison))
    console.print(f"plot written to [bold]{comparison.png}[/]")
