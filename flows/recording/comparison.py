"""Recorded runs side by side (``MlflowClient.search_runs``): a table and a PNG, no Prefect.

A "run" is a parent run written by ``record_run`` (a simulation or a real cluster run) or by a
cluster flow whose jobs a running service scheduled (``service_run``); its nested job runs give
the per-job JCTs for the plot and the models trained. Jobs a service ran for anyone else are
compared by selection (``service_selection``: job ids, submitter, time window), one column each. ``malleable compare``
calls this directly (a read-only look needs no flow run, so no Prefect server); the ``compare``
flow in ``flows/compare_flow.py`` wraps it with artifacts for deployments.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from flows.config.settings import load_settings
from flows.config.local_state import DamagedStateError, check_sqlite
from flows.recording.tracking import PARENT_TAG, store_damaged, unavailable
from flows.recording.compare_plot import plot_comparison, png_path  # noqa: F401  (png_path: part of this module's API)
from flows.recording.service_selection import SERVICE_JOB, Selection, describe, select, service_gpus, summary
from service.redaction import redact_url

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
    found: tuple[str, ...] = ()  # one line per selection of service jobs: what it found


def _client(experiment_name: str | None = None) -> tuple[MlflowClient, str]:
    settings = load_settings()
    experiment_name = experiment_name or settings.experiment
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
        experiment = client.get_experiment_by_name(experiment_name)
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
        raise CompareError(f"experiment={experiment_name!r}: no such MLflow experiment at {redact_url(uri)} (record a run first)")
    return client, experiment.experiment_id


def check_run_ids(run_ids: Sequence[str]) -> None:
    """Run ids are MLflow's hex ids: anything else would be pasted into a filter string."""
    for rid in run_ids:
        if not _RUN_ID.fullmatch(rid):
            raise ValueError(f"run={rid!r}: not an MLflow run id (letters, digits, '-' or '_')")


def check_runs(run_ids: Sequence[str], experiment: str | None = None) -> None:
    """Fail fast (CompareError, one line) before a flow run starts: experiment and ids exist."""
    check_run_ids(run_ids)
    client, experiment_id = _client(experiment)
    for rid in run_ids:
        if not client.search_runs([experiment_id], filter_string=f"attributes.run_id = '{rid}'"):
            raise CompareError(f"run={rid!r}: no such run in the experiment")


def _is_run(run) -> bool:  # noqa: ANN001 - an mlflow Run
    """A recorded run (a parent of job runs), not one of its jobs nor a service job run."""
    tags = run.data.tags
    return PARENT_TAG not in tags and tags.get("malleable.kind") not in (SERVICE_JOB, "service")


def find_runs(run_ids: Sequence[str], last: int, experiment: str | None = None) -> list[ComparedRun]:
    client, experiment_id = _client(experiment)
    if run_ids:
        found = []
        for rid in run_ids:
            hits = client.search_runs([experiment_id], filter_string=f"attributes.run_id = '{rid}'")
            if not hits:
                raise CompareError(f"run={rid!r}: no such run in the experiment")
            found.append(hits[0])
    else:
        hits = client.search_runs([experiment_id], filter_string="tags.`malleable.mode` != ''", order_by=["attributes.start_time DESC"], max_results=500)
        found = [r for r in hits if _is_run(r)][:last]
        found.reverse()  # oldest first reads naturally left to right
    if len(found) < 1:
        raise CompareError(
            "no recorded runs to compare (run `malleable run` or `malleable quickstart` first; "
            "jobs of a running service: --submitter, --jobs or --since)"
        )
    # A service nests its job runs under the run that submitted them, in its own experiment.
    everywhere = [e.experiment_id for e in client.search_experiments()]
    out = []
    for run in found:
        children = client.search_runs(everywhere, filter_string=f"tags.`{PARENT_TAG}` = '{run.info.run_id}'", max_results=5000)
        jct = tuple(sorted((c.data.tags.get("malleable.name", c.info.run_name), c.data.metrics.get("jct_s")) for c in children))
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


def find_service_jobs(selections: Sequence[Selection], experiment: str | None = None) -> tuple[list[ComparedRun], list[str]]:
    """One column per selection of service job runs, and one line per selection saying what it found."""
    client, experiment_id = _client(experiment)
    name = experiment or load_settings().experiment
    columns, lines = [], []
    for selection in selections:
        jobs = select(client, [experiment_id], selection)
        lines.append(describe(selection, jobs, name))
        if not jobs:
            raise CompareError(f"{selection.label}: no service job runs in experiment {name!r} (jobs submitted to `malleable serve` with MLflow tracking)")
        since = min(j.submitted_s for j in jobs)
        until = max([j.ended_s or j.submitted_s for j in jobs])
        gpus = service_gpus(client, [experiment_id], since, until)
        figures = summary(jobs, gpus)
        figures["rescales"] = float(sum(j.rescales for j in jobs))
        columns.append(
            ComparedRun(
                run_id="",
                name=selection.label,
                mode="service",
                policy=",".join(sorted({j.policy for j in jobs})),
                capacity="-" if gpus is None else str(gpus),
                summary=tuple((k, figures.get(k)) for k in SUMMARY_KEYS),
                job_jct_s=tuple((j.name, j.jct_s) for j in jobs),
                workloads=tuple(sorted({j.workload for j in jobs if j.workload})),
            )
        )
    return columns, lines


def mixed_models_warning(runs: Sequence[ComparedRun]) -> str | None:
    """One line when the runs side by side trained different models (their JCTs do not compare)."""
    kinds = {r.workloads for r in runs}
    if len(kinds) <= 1:
        return None
    described = "; ".join(f"{r.name}: {', '.join(r.workloads) or '?'}" for r in runs)
    return f"these runs trained different models ({described}): their times do not compare like for like"


def compare_runs(run_ids: Sequence[str], last: int, out: Path, selections: Sequence[Selection] = (), experiment: str | None = None) -> Comparison:
    """Find the runs (by id, else the latest ``last`` unless service jobs are selected) and the
    selections of service jobs; plot them side by side."""
    if last < 1:
        raise CompareError(f"last={last}: must be >= 1")
    runs = find_runs(list(run_ids), last, experiment) if run_ids or not selections else []
    columns, found = find_service_jobs(selections, experiment) if selections else ([], [])
    runs = [*runs, *columns]
    return Comparison(tuple(runs), plot_comparison(runs, out), tuple(found))
