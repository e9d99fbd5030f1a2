"""Job traces as CSV or JSON text: one row per job. Errors name the row and the column.

Columns (CSV header / JSON keys):

=============  ========  ======================================================
name           required  unique job name
submit_s       required  submit time, seconds from the start
category       optional  seed-000 category 1-4 (selects profile ``cat<N>``)
model          optional  workload name (default: the profile's)
samples        required  work in samples
min_batch      required  global batch range
max_batch      required
max_gpus       required
elastic        optional  true/false (default true)
gpus           optional  GPUs for a non-elastic job (default 1)
profile        optional  profile name; default ``cat<category>``, else ``model``
noise_scale    optional  gradient noise scale: a number, ``f:v f:v ...`` (v from fraction f
                         of the work on), a JSON mapping of any ``allocator.physics.noise`` form,
                         or the name of a trajectory the caller passes (``named``; the CLI's
                         ``--noise FILE``) (default: the profile's, else none)
base_batch     optional  B0, the batch ``samples`` are counted at (default: min_batch, or
                         max_batch for a non-elastic job)
team           optional  the job's team (``allocator.fairness``; default: its submitter's)
submitter      optional  who submitted it
priority       optional  a priority class (best-effort, default, nightly) or an integer (default 0)
size           optional  exact (default), estimate or unknown: how far ``samples`` can be trusted
actual_samples optional  simulations only: the work the job really does (default: ``samples``)
=============  ========  ======================================================
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping

from allocator.fairness.priority import priority_value
from allocator.physics.noise import NoiseTrajectory, noise_from_cell, noise_from_value, noise_to_cell
from allocator.types import JobSpec, SizeKnowledge, ThroughputProfile

COLUMNS = (
    "name", "submit_s", "category", "model", "samples", "min_batch", "max_batch", "max_gpus", "elastic", "gpus", "profile", "noise_scale", "base_batch",
    "team", "submitter", "priority", "size", "actual_samples",
)  # fmt: skip
_REQUIRED = ("name", "submit_s", "samples", "min_batch", "max_batch", "max_gpus")


class TraceError(ValueError):
    pass


# A noise_scale cell that is a name (not a number, a trajectory or JSON) refers to a named trajectory.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def _int(row: Mapping[str, object], column: str, where: str) -> int:
    value = row.get(column)
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except (TypeError, ValueError):
        raise TraceError(f"{where}, column {column}={value!r}: must be an integer") from None
    return number


def _float(row: Mapping[str, object], column: str, where: str) -> float:
    value = row.get(column)
    try:
        return float(str(value).strip()) if not isinstance(value, (int, float)) or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{where}, column {column}={value!r}: must be a number") from None


def _bool(value: object, column: str, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", ""):
        return True
    if text in ("false", "0", "no"):
        return False
    raise TraceError(f"{where}, column {column}={value!r}: must be true or false")


def _present(row: Mapping[str, object], column: str) -> bool:
    return row.get(column) not in (None, "")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _noise(row: Mapping[str, object], where: str, named: Mapping[str, NoiseTrajectory]) -> NoiseTrajectory | None:
    """A CSV cell is text (``noise_from_cell``) or a name from ``named``; a JSON row may hold a number or a mapping."""
    if not _present(row, "noise_scale"):
        return None
    value = row["noise_scale"]
    if isinstance(value, str) and _NAME.fullmatch(value.strip()) and not _is_number(value):
        if value.strip() not in named:
            known = ", ".join(sorted(named)) or "none given"
            raise TraceError(f"{where}, column noise_scale={value!r}: names no trajectory of the noise file (known: {known})")
        return named[value.strip()]
    try:
        return noise_from_cell(value, "noise_scale") if isinstance(value, str) else noise_from_value(value, "noise_scale")
    except ValueError as exc:
        raise TraceError(f"{where}, column {exc}") from None


def _priority(row: Mapping[str, object], where: str) -> int:
    if not _present(row, "priority"):
        return 0
    value = row["priority"]
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    try:
        return priority_value(value, "priority")
    except ValueError as exc:
        raise TraceError(f"{where}, column {exc}") from None


def job_from_row(row: Mapping[str, object], where: str, profiles: Mapping[str, ThroughputProfile], named: Mapping[str, NoiseTrajectory] | None = None) -> JobSpec:
    for column in _REQUIRED:
        if not _present(row, column):
            raise TraceError(f"{where}, column {column}: missing value")
    if None in row:  # csv.DictReader files fields beyond the header under the key None
        extra = row[None]  # type: ignore[index]
        raise TraceError(f"{where}: {len(row) - 1 + len(extra)} fields but the header has {len(row) - 1} columns (extra: {extra!r})")  # type: ignore[arg-type]
    unknown = sorted(str(c) for c in set(row) - set(COLUMNS))
    if unknown:
        raise TraceError(f"{where}, column {unknown[0]}: unknown column (known: {', '.join(COLUMNS)})")
    if _present(row, "profile"):
        key = str(row["profile"])
    elif _present(row, "category"):
        key = f"cat{_int(row, 'category', where)}"
    elif _present(row, "model"):
        key = str(row["model"])
    else:
        raise TraceError(f"{where}, column profile: missing (give profile, category or model)")
    if key not in profiles:
        raise TraceError(f"{where}, column profile={key!r}: no such profile (known: {', '.join(sorted(profiles))})")
    profile = profiles[key]
    elastic = _bool(row.get("elastic", True), "elastic", where)
    noise_scale = _noise(row, where, named or {})
    try:
        return JobSpec(
            id=str(row["name"]),
            workload=str(row["model"]) if _present(row, "model") else profile.workload,
            total_samples=_int(row, "samples", where),
            min_batch=_int(row, "min_batch", where),
            max_batch=_int(row, "max_batch", where),
            max_gpus=_int(row, "max_gpus", where),
            requested_gpus=_int(row, "gpus", where) if _present(row, "gpus") else None,
            profile=profile,
            elastic=elastic,
            arrival_time=_float(row, "submit_s", where),
            fixed_batch=None if elastic else _int(row, "max_batch", where),
            noise_scale=noise_scale,
            base_batch=_int(row, "base_batch", where) if _present(row, "base_batch") else None,
            team=str(row["team"]) if _present(row, "team") else None,
            submitter=str(row["submitter"]) if _present(row, "submitter") else None,
            priority=_priority(row, where),
            size=str(row["size"]).strip() if _present(row, "size") else SizeKnowledge.EXACT,
            actual_samples=_int(row, "actual_samples", where) if _present(row, "actual_samples") else None,
        )
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from None


def read_trace(
    text: str, fmt: str, profiles: Mapping[str, ThroughputProfile], source: str = "trace", named: Mapping[str, NoiseTrajectory] | None = None
) -> list[JobSpec]:
    """Parse a trace; ``fmt`` is ``csv`` or ``json``. Rows are numbered from 1 (CSV: after the header).
    ``named``: trajectories a ``noise_scale`` cell may name."""
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(text))
        rows: list[Mapping[str, object]] = [dict(r) for r in reader]
    elif fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{source}: not valid JSON ({exc})") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise TraceError(f"{source}: expected a JSON list of job objects")
        rows = data
    else:
        raise TraceError(f"format={fmt!r}: use csv or json")
    if not rows:
        raise TraceError(f"{source}: no jobs (the trace is empty or has only a header)")
    jobs = [job_from_row(row, f"{source} row {i}", profiles, named) for i, row in enumerate(rows, start=1)]
    seen: set[str] = set()
    for i, job in enumerate(jobs, start=1):
        if job.id in seen:
            raise TraceError(f"{source} row {i}, column name={job.id!r}: duplicate job name")
        seen.add(job.id)
    return jobs


def _row(job: JobSpec, profile_names: Mapping[ThroughputProfile, str]) -> dict[str, object]:
    return {
        "name": job.id,
        "submit_s": job.arrival_time,
        "category": "",
        "model": job.workload,
        "samples": job.total_samples,
        "min_batch": job.min_batch,
        "max_batch": job.max_batch,
        "max_gpus": job.max_gpus,
        "elastic": "true" if job.elastic else "false",
        "gpus": job.requested_gpus,
        "profile": profile_names.get(job.profile, job.profile.workload),
        "noise_scale": "" if job.noise_scale is None or job.noise_scale == job.profile.noise_scale else noise_to_cell(job.noise_scale),
        "base_batch": "" if job.base_batch is None else job.base_batch,
        "size": "" if job.size is SizeKnowledge.EXACT else job.size.value,
        "actual_samples": "" if job.actual_samples is None else job.actual_samples,
        "team": job.team or "",
        "submitter": job.submitter or "",
        "priority": job.priority or "",
    }


def write_trace(jobs: Iterable[JobSpec], fmt: str, profiles: Mapping[str, ThroughputProfile]) -> str:
    """Serialise jobs; each job's profile is written by the name it has in ``profiles``."""
    names = {p: name for name, p in profiles.items()}
    rows = [_row(j, names) for j in jobs]
    if fmt == "json":
        return json.dumps(rows, indent=1) + "\n"
    if fmt != "csv":
        raise TraceError(f"format={fmt!r}: use csv or json")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
