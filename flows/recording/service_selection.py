"""Service jobs picked for ``malleable compare``: by job ids, by submitter, by a time window.

A team's service records one MLflow run per job (``service.tracking``), not a run per
experiment. A selection of those job runs is compared as one column, with the figures a
recorded run has, computed from the job runs' own end values (``service.job_metrics``): JCT
per job, jobs done, makespan from the first submission to the last end, and GPU utilisation
= the jobs' GPU-seconds over the GPUs the service had (its own run's ``gpus_alive``) times the
makespan.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

SERVICE_JOB = "service-job"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_when(text: str, option: str, now: float | None = None) -> float:
    """An epoch time from ``2h`` (that long ago), ``30m``, ``1d`` or an ISO date/time; ValueError naming the option."""
    now = time.time() if now is None else now
    m = _DURATION.match(text.strip())
    if m:
        return now - float(m[1]) * _UNIT_S[m[2]]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(f"{option}={text!r}: give a duration ago (30m, 2h, 1d) or a date/time (2025-06-01T14:00)") from None


@dataclass(frozen=True, slots=True)
class Selection:
    """What one column of the comparison holds: service jobs by ``job_ids``, or by ``submitter``,
    within [``since``, ``until``) of their submission (either bound may be open)."""

    label: str
    job_ids: tuple[str, ...] = ()
    submitter: str | None = None
    since: float | None = None
    until: float | None = None

    def filter_string(self) -> str:
        parts = [f"tags.`malleable.kind` = '{SERVICE_JOB}'"]
        if self.submitter is not None and " (" in self.submitter:
            parts.append(f"tags.`malleable.submitter` = '{_quoted(self.submitter)}'")
        elif self.submitter is not None:
            # A plain name ("alice") also matches the store's "alice (alice@laptop)" (PostgreSQL
            # records the role first); the exact identity is checked after the search (``select``).
            parts.append(f"tags.`malleable.submitter` LIKE '{_quoted(_like_escaped(self.submitter))}%'")
        if self.until is not None:
            parts.append(f"attributes.start_time < {int(self.until * 1000)}")
        return " and ".join(parts)


def _like_escaped(text: str) -> str:
    # LIKE's wildcards in a name match themselves only after the exact check in ``select``.
    return text.replace("%", "_")


def submitter_matches(tag: str | None, wanted: str) -> bool:
    """``wanted`` as shown ("alice (alice@laptop)", "alice@laptop"), or the plain name: the role
    before " (" (PostgreSQL) or the user before "@" (sqlite's user@host)."""
    if tag is None:
        return False
    if tag == wanted or " (" in wanted:
        return tag == wanted
    identity = tag.split(" (", 1)[0]
    return identity == wanted or ("@" not in wanted and identity.split("@", 1)[0] == wanted)


def _quoted(text: str) -> str:
    if "'" in text:
        raise ValueError(f"--submitter={text!r}: must not contain a quote")
    return text


@dataclass(frozen=True, slots=True)
class ServiceJobRun:
    """One service job's run, as far as a comparison needs it."""

    run_id: str
    job_id: str
    name: str
    status: str
    submitted_s: float  # epoch seconds
    ended_s: float | None
    jct_s: float | None
    gpu_seconds: float
    rescales: float
    policy: str
    workload: str | None


def job_run(run) -> ServiceJobRun:  # noqa: ANN001 - an mlflow Run
    metrics, tags = run.data.metrics, run.data.tags
    started = run.info.start_time / 1000.0
    submitted = started - metrics.get("queue_delay_s", 0.0)
    jct = metrics.get("jct_s")
    ended = submitted + jct if jct is not None else (run.info.end_time / 1000.0 if run.info.end_time else None)
    return ServiceJobRun(
        run_id=run.info.run_id,
        job_id=tags.get("malleable.job_id", run.info.run_id[:8]),
        name=tags.get("malleable.name", run.info.run_name or run.info.run_id[:8]),
        status=run.info.status,
        submitted_s=submitted,
        ended_s=ended,
        jct_s=jct,
        gpu_seconds=metrics.get("gpu_seconds", 0.0),
        rescales=metrics.get("rescales", 0.0),
        policy=tags.get("malleable.policy", "-"),
        workload=run.data.params.get("workload"),
    )


def select(client, experiment_ids: Sequence[str], selection: Selection) -> list[ServiceJobRun]:  # noqa: ANN001 - MlflowClient
    runs = client.search_runs(list(experiment_ids), filter_string=selection.filter_string(), max_results=5000)
    if selection.submitter is not None:
        runs = [r for r in runs if submitter_matches(r.data.tags.get("malleable.submitter"), selection.submitter)]
    jobs = [job_run(r) for r in runs]
    if selection.job_ids:
        wanted = set(selection.job_ids)
        jobs = [j for j in jobs if j.job_id in wanted or j.name in wanted]
    if selection.since is not None:
        jobs = [j for j in jobs if j.submitted_s >= selection.since]
    if selection.until is not None:
        jobs = [j for j in jobs if j.submitted_s < selection.until]
    return sorted(jobs, key=lambda j: (j.submitted_s, j.job_id))


def service_gpus(client, experiment_ids: Sequence[str], since: float, until: float) -> int | None:  # noqa: ANN001
    """The most GPU workers a service had alive in [since, until] (its own run's ``gpus_alive``)."""
    best = None
    for run in client.search_runs(list(experiment_ids), filter_string="tags.`malleable.kind` = 'service'", max_results=200):
        if run.info.start_time / 1000.0 > until or (run.info.end_time and run.info.end_time / 1000.0 < since):
            continue
        for m in client.get_metric_history(run.info.run_id, "gpus_alive"):
            if since - 60 <= m.timestamp / 1000.0 <= until + 60:
                best = max(best or 0, int(m.value))
    return best


def summary(jobs: Sequence[ServiceJobRun], gpus: int | None) -> dict[str, float | None]:
    """The comparison's figures for a selection of service jobs (None: not measurable here)."""
    jct = np.array([j.jct_s for j in jobs if j.jct_s is not None], dtype=float)
    ends = [j.ended_s for j in jobs if j.ended_s is not None]
    makespan = max(ends) - min(j.submitted_s for j in jobs) if ends else None
    util = sum(j.gpu_seconds for j in jobs) / (gpus * makespan) if gpus and makespan else None
    return {
        "jobs_completed": float(jct.size),
        "avg_jct_s": float(jct.mean()) if jct.size else None,
        "p95_jct_s": float(np.percentile(jct, 95)) if jct.size else None,
        "gpu_utilisation": util,
        "rescales": None,
        "makespan_s": makespan,
        "sjs_efficiency": None,
    }


def describe(selection: Selection, jobs: Sequence[ServiceJobRun], experiment: str) -> str:
    """One line saying what a selection found."""
    states: dict[str, int] = {}
    for j in jobs:
        states[j.status.lower()] = states.get(j.status.lower(), 0) + 1
    counted = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "none"
    return f"{selection.label}: {len(jobs)} service job run(s) in experiment {experiment!r} ({counted})"
