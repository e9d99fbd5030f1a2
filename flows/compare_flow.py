"""The ``compare`` flow: ``flows.recording.comparison`` with Prefect artifacts, for deployments and the UI."""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.recording.comparison import CompareError, ComparedRun, Comparison, check_runs, compare_runs, find_runs, mixed_models_warning, plot_comparison
from flows.recording.artifacts import artifact_key

__all__ = ["CompareError", "ComparedRun", "Comparison", "check_runs", "compare_flow", "find_runs", "mixed_models_warning", "plot_comparison"]


@flow(name="compare", log_prints=True)
def compare_flow(run_ids: list[str] | None = None, last: int = 2, out: str = "out/compare.png") -> Comparison:
    """Put recorded runs side by side: a table (Prefect artifact) and a PNG of per-job JCTs."""
    comparison = compare_runs(list(run_ids or []), last, Path(out))
    runs, png = comparison.runs, comparison.png
    warning = mixed_models_warning(runs)
    if warning:
        print(f"warning: {warning}")
    create_table_artifact(
        key=artifact_key("compare"),
        table=[{"run": r.name, "mode": r.mode, "policy": r.policy, "gpus": r.capacity, **{k: "-" if v is None else f"{v:.3g}" for k, v in r.summary}} for r in runs],
        description="recorded runs side by side",
    )
    create_markdown_artifact(key=artifact_key("compare-plot"), markdown=f"Per-job JCT plot written to `{png.resolve()}`.")
    return comparison
