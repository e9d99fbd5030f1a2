"""The tracking journal's records: one frozen type per buffered MLflow call, and their JSON lines.

``BufferedTracker`` (``service.tracking.buffered``) appends these while the store is away and
replays them in order later, possibly from another process, so the JSON form is a file format:
the field names below are what a journal written by any earlier version holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True, slots=True)
class CreateRun:
    """Create a run; ``ref`` is the local name later calls use until the server gives its id."""

    ref: str
    name: str
    parent: str | None
    tags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LogBatch:
    """Metrics ``(key, value, timestamp_ms, step)``, params and tags for one run, in one request."""

    run: str
    metrics: tuple[tuple[str, float, int, int], ...] = ()
    params: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LogArtifact:
    """A file (or, with ``directory``, a whole directory) to upload under ``artifact_path``."""

    run: str
    path: str
    artifact_path: str | None = None
    directory: bool = False


@dataclass(frozen=True, slots=True)
class Terminate:
    run: str
    status: str


@dataclass(frozen=True, slots=True)
class Reopen:
    """Mark an ended run running again: a service job that resumes continues its run."""

    run: str


@dataclass(frozen=True, slots=True)
class RunRefs:
    """Local run references already created on the server: ``(offline ref, server id)``."""

    pairs: tuple[tuple[str, str], ...]


JournalOp = Union[CreateRun, LogBatch, LogArtifact, Terminate, Reopen]
JournalRecord = Union[JournalOp, RunRefs]


def to_json(record: JournalRecord) -> str:
    """One journal line (without the newline)."""
    data: dict[str, object]
    if isinstance(record, CreateRun):
        data = {"op": "create_run", "ref": record.ref, "name": record.name, "parent": record.parent, "tags": dict(record.tags)}
    elif isinstance(record, LogBatch):
        data = {"op": "log_batch", "run": record.run}
        for name in ("metrics", "params", "tags"):
            items = getattr(record, name)
            if items:
                data[name] = [list(item) for item in items]
    elif isinstance(record, LogArtifact):
        data = {"op": "artifacts" if record.directory else "artifact", "run": record.run, "path": record.path, "artifact_path": record.artifact_path}
    elif isinstance(record, Terminate):
        data = {"op": "terminate", "run": record.run, "status": record.status}
    elif isinstance(record, Reopen):
        data = {"op": "reopen", "run": record.run}
    elif isinstance(record, RunRefs):
        data = {"op": "refs", "map": dict(record.pairs)}
    else:
        raise TypeError(f"not a journal record: {record!r}")
    return json.dumps(data)


def _pairs(items: object) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in items)  # type: ignore[attr-defined]


def from_json(data: Mapping[str, object]) -> JournalRecord:
    """The record a parsed journal line holds; ``ValueError`` names an unknown or incomplete one."""
    kind = data.get("op")
    try:
        if kind == "create_run":
            return CreateRun(str(data["ref"]), str(data["name"]), data["parent"], _pairs(dict(data["tags"]).items()))  # type: ignore[arg-type]
        if kind == "log_batch":
            return LogBatch(
                str(data["run"]),
                metrics=tuple((str(k), float(v), int(ts), int(step)) for k, v, ts, step in data.get("metrics", ())),  # type: ignore[attr-defined]
                params=_pairs(data.get("params", ())),
                tags=_pairs(data.get("tags", ())),
            )
        if kind in ("artifact", "artifacts"):
            return LogArtifact(str(data["run"]), str(data["path"]), data.get("artifact_path"), directory=kind == "artifacts")  # type: ignore[arg-type]
        if kind == "terminate":
            return Terminate(str(data["run"]), str(data["status"]))
        if kind == "reopen":
            return Reopen(str(data["run"]))
        if kind == "refs":
            return RunRefs(_pairs(dict(data["map"]).items()))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"journal op={kind!r}: malformed ({type(exc).__name__}: {exc})") from None
    raise ValueError(f"journal op={kind!r}: unknown")
