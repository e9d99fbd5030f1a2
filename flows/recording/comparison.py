"""Recorded runs side by side (``MlflowClient.search_runs``): a table and a PNG, no Prefect.

A "run" is a parent run written by ``record_run`` (a simulation or a real cluster run); its
nested job runs give the per-job JCTs for the plot and the models trained. ``malleable compare``
calls this directly (a read-only look needs no flow run, so no Prefect server); the ``compare``
flow in ``flows/compare_flow.py`` wraps it with artifacts for deployments.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402

from flows.config.settings import load_settings  # noqa: E402
from flows.config.local_state import DamagedStateError, check_sqlite  # noqa: E402
from flows.recording.tracking import PARENT_TAG, store_damaged, unavailable  # noqa: E402
from service.redaction import redact_url  # noqa: E402

_RUN_ID = re.compile(r"[A-Za-z0-9_-]+")

SUMMARY_KEYS = ("jobs_completed", "avg_jct_s", "p95_jct_s", "gpu_utilisation", "sjs_efficiency", "rescales", "makespan_s")


class CompareError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ComparedRun:
    run_id: str
    name: str
    mode: str
    policy: str
    capacity: str
    summary: tuple[tuple[str, float | None], ...]
    job_jct_s: tuple[tuple[str, float | None], ...]
    workloads: tuple[str, ...] = ()  # the models its jobs trained, sorted, distinct

    def value(self, key: str) -> float | None:
        return dict(self.summary).get(key)


@dataclass(frozen=True, slots=True)
class Comparison:
    runs: tuple[ComparedRun, ...]
    png: Path


def _client() -> tuple[MlflowClient, str]:
    settings = load_settings()
    uri = settings.resolved_tracking_uri
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        # Opening it would create an empty store: say there is nothing to compare instead.
        raise CompareError(f"no MLflow store at {uri.removeprefix('sqlite:///')} (record a run first: `malleable quickstart` or `malleable run`)")
    if uri.startswith("http"):
        # mlflow's default retries an unreachable server for minutes; one short try is enough here.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(settings.tracking_timeout_s))))
    try:
        if uri.startswith("sqlite:///"):
            check_sqlite(Path(uri.removeprefix("sqlite:///")), "MLflow store", "record runs again into a fresh one")
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(settings.experiment)
    except DamagedStateError as exc:
        raise CompareError(str(exc)) from None
    except Exception as exc:
        if store_damaged(exc):
            path = uri.removeprefix("sqlite:///")
            raise CompareError(f"MLflow store {path} is damaged ({type(exc).__name__}); move it aside (mv {path} {path}.damaged) and record runs again") from None
        if unavailable(exc):
            raise CompareError(f"MLflow at {redact_url(uri)} is unreachable ({type(exc).__name__}); start it or set MALLEABLE_TRACKING_URI") from None
        if isinstance(exc, MlflowException):  # e.g. a 403: the server's --allowed-hosts does not list us
            raise CompareError(
                f"MALLEABLE_TRACKING_URI={redact_url(uri)!r}: MLflow did not answer ({str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}); "
                "if it says 403, start the server with --allowed-hosts listing this host name"
            ) from None
        raise
    if experiment is None:
        raise CompareError(f"experiment={settings.experiment!r}: no such MLflow experiment at {redact_url(uri)} (record a run first)")
    return client, experiment.experiment_id


def check_run_ids(run_ids: Sequence[str]) -> None:
    """Run ids are MLflow's hex ids: anything else would be pasted into a filter string."""
    for rid in run_ids:
        if not _RUN_ID.fullmatch(rid):
            raise ValueError(f"run={rid!r}: not an MLflow run id (letters, digits, '-' or '_')")


def png_path(path: Path) -> Path:
    """Where the plot really goes: matplotlib adds ``.png`` to a name without a suffix."""
    return path if path.suffix else path.with_suffix(".png")


def check_runs(run_ids: Sequence[str]) -> None:
    check_run_ids(run_ids)
    """Fail fast (CompareError, one line) before a flow run starts: experiment and ids exist."""
    client, experiment_id = _client()
    for rid in run_ids:
        if not client.search_runs([experiment_id], filter_string=f"attributes.run_id = '{rid}'"):
            raise CompareError(f"run={rid!r}: no such run in the experiment")


def find_runs(run_ids: Sequence[str], last: int) -> list[ComparedRun]:
    client, experiment_id = _client()
    if run_ids:
        found = []
        for rid in run_ids:
            hits = client.search_runs([experiment_id], filter_string=f"attributes.run_id = '{rid}'")
            if not hits:
                raise CompareError(f"run={rid!r}: no such run in the experiment")
            found.append(hits[0])
    else:
        hits = client.search_runs([experiment_id], filter_string="tags.`malleable.mode` != ''", order_by=["attributes.start_time DESC"], max_results=200)
        found = [r for r in hits if PARENT_TAG not in r.data.tags][:last]
        found.reverse()  # oldest first reads naturally left to right
    if len(found) < 1:
        raise CompareError("no recorded runs to compare (run `malleable run` or `malleable quickstart` first)")
    out = []
    for run in found:
        children = client.search_runs([experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{run.info.run_id}'")
        jct = tuple(sorted((c.info.run_name, c.data.metrics.get("jct_s")) for c in children))
        out.append(
            ComparedRun(
                run_id=run.info.run_id,
                name=run.info.run_name or run.info.run_id[:8],
                mode=run.data.params.get("mode", "-"),
                policy=run.data.params.get("policy", "-"),
                capacity=run.data.params.get("capacity", "-"),
                summary=tuple((k, run.data.metrics.get(k)) for k in SUMMARY_KEYS),
                job_jct_s=jct,
                workloads=tuple(sorted({c.data.params["workload"] for c in children if "workload" in c.data.params})),
            )
        )
    return out


def plot_comparison(runs: Sequence[ComparedRun], path: Path) -> Path:
    """Per-job JCT, one bar per run, side by side."""
    jobs = sorted({j for r in runs for j, _ in r.job_jct_s})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + 0.9 * len(jobs)), 4.2))
    width = 0.8 / max(1, len(runs))
    x = np.arange(len(jobs))
    for i, run in enumerate(runs):
        jct = dict(run.job_jct_s)
        heights = [np.nan if jct.get(j) is None else jct[j] / 60.0 for j in jobs]
        ax.bar(x + (i - (len(runs) - 1) / 2) * width, heights, width, label=f"{run.name} ({run.mode}, {run.policy})")
    ax.set_xticks(x, jobs, rotation=30 if len(jobs) > 6 else 0, fontsize=8)
    ax.set_ylabel("job completion time (min)")
    ax.set_title("per-job JCT, runs side by side", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = png_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def mixed_models_warning(runs: Sequence[ComparedRun]) -> str | None:
    """One line when the runs side by side trained different models (their JCTs do not compare)."""
    kinds = {r.workloads for r in runs}
    if len(kinds) <= 1:
        return None
    described = "; ".join(f"{r.name}: {', '.join(r.workloads) or '?'}" for r in runs)
    return f"these runs trained different models ({described}): their times do not compare like for like"


def compare_runs(run_ids: Sequence[str], last: int, out: Path) -> Comparison:
    """Find the runs (by id, else the latest ``last``) and plot their per-job JCTs."""
    if last < 1:
        raise CompareError(f"last={last}: must be >= 1")
    runs = find_runs(list(run_ids), last)
    return Comparison(tuple(runs), plot_comparison(runs, out))
