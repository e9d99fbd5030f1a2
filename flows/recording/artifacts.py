"""Prefect artifacts for a flow run: schedule and results tables, a markdown summary, progress.

Keys are lowercase letters, digits and dashes (Prefect rejects anything else).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact

from allocator.loop import LoopResult
from flows.recording.record import JobOutcome


def artifact_key(*parts: str) -> str:
    key = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return re.sub(r"-{2,}", "-", key)[:100] or "malleable"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def outcome_rows(outs: Sequence[JobOutcome]) -> list[dict[str, str]]:
    return [
        {
            "job": o.job_id,
            "state": o.state,
            "arrival_s": _fmt(o.arrival_s),
            "start_s": _fmt(o.start_s),
            "finish_s": _fmt(o.finish_s),
            "jct_s": _fmt(o.jct_s),
            "rescales": str(o.rescales),
            "final_accuracy": _fmt(o.final_accuracy, 3),
            "error": o.error or "",
        }
        for o in outs
    ]


def publish_results(flow_name: str, result: LoopResult, outs: Sequence[JobOutcome], summary_md: str) -> None:
    """Schedule table, results table and markdown summary for this flow run."""
    create_table_artifact(
        key=artifact_key(flow_name, "schedule"),
        table=[{"time_s": f"{r.time:.1f}", "job": r.job_id, "gpus": r.gpus, "batch": r.batch} for r in result.schedule],
        description=f"{flow_name}: GPUs and global batch per job over time ({result.policy})",
    )
    create_table_artifact(key=artifact_key(flow_name, "results"), table=outcome_rows(outs), description=f"{flow_name}: per-job results")
    create_markdown_artifact(key=artifact_key(flow_name, "summary"), markdown=summary_md, description=f"{flow_name}: summary")


class ProgressArtifact:
    """A Prefect progress artifact advanced as jobs finish (0-100 %)."""

    def __init__(self, description: str, total: int) -> None:
        self._total = max(1, total)
        self._id = create_progress_artifact(progress=0.0, description=description)

    def update(self, done: int) -> None:
        if self._id is not None:
            update_progress_artifact(self._id, progress=100.0 * min(done, self._total) / self._total)


def summary_markdown(title: str, outs: Sequence[JobOutcome], lines: Sequence[str] = ()) -> str:
    md = [f"# {title}", ""]
    md += [f"* {line}" for line in lines]
    md += ["", "| job | state | arrival s | start s | finish s | JCT s | rescales | final accuracy |", "|---|---|---|---|---|---|---|---|"]
    for o in outs:
        md.append(
            f"| {o.job_id} | {o.state} | {_fmt(o.arrival_s)} | {_fmt(o.start_s)} | {_fmt(o.finish_s)} | {_fmt(o.jct_s)} | {o.rescales} | {_fmt(o.final_accuracy, 3)} |"
        )
    return "\n".join(md) + "\n"
