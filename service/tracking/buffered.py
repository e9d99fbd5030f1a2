"""MLflow through ``MlflowClient``, with a local buffer for when the tracking server is away.

Training must never stop because the tracking server did. Every call goes through
``Tracker``: while the server answers, calls go straight to it; when a call fails because the
server cannot be reached, the user is told once, that call and every later one are appended
to a JSONL journal on local disk (artifacts copied beside it), and each later call first
tries — at most every ``retry_every_s`` — to replay the journal in order. Runs created while
offline get a local reference (``offline-…``) that the replay maps to the real run id; the
map is kept in the journal, so a later process (the next ``malleable`` command) can finish a
flush this one could not.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import requests
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from flows.recording.journal import CreateRun, JournalOp, LogArtifact, LogBatch, RunRefs, Terminate, from_json, to_json
from flows.config.local_state import DamagedStateError, check_sqlite
from service.tracking import ensure_experiment
from service.redaction import redact_url

PARENT_TAG = "mlflow.parentRunId"
OFFLINE_PREFIX = "offline-"
# log_batch accepts at most 1000 metrics and 100 params per call.
_MAX_METRICS, _MAX_PARAMS = 1000, 100


@dataclass(frozen=True, slots=True)
class MetricPoint:
    key: str
    value: float
    step: int = 0
    timestamp_ms: int | None = None


def _unreachable(exc: BaseException) -> bool:
    """Did the call fail because the server could not be reached (rather than a bad request)?"""
    if isinstance(exc, (requests.RequestException, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, MlflowException):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, (requests.RequestException, ConnectionError, TimeoutError)):
            return True
        text = str(exc)
        return "Max retries exceeded" in text or "Connection refused" in text or "timed out" in text
    return False


def _host(uri: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(uri).netloc or uri


def _refused(exc: BaseException) -> bool:
    """Did a server answer 403? MLflow's server does so to any client whose Host header its
    ``--allowed-hosts`` does not list (``Invalid Host header``), while ``/health`` still passes."""
    return isinstance(exc, MlflowException) and "error code 403" in str(exc)


def store_damaged(exc: BaseException) -> bool:
    """Is a local store broken (a truncated or corrupt sqlite file) rather than the request bad?"""
    seen: BaseException | None = exc
    while seen is not None:
        # sqlite3.DatabaseError and sqlalchemy's DatabaseError (which wraps it) share the name.
        if isinstance(seen, DamagedStateError) or type(seen).__name__ == "DatabaseError" or "database disk image is malformed" in str(seen) or "file is not a database" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def unavailable(exc: BaseException) -> bool:
    """The store cannot be used now: the server is unreachable or the local store is damaged."""
    return _unreachable(exc) or store_damaged(exc)


def _say(message: str) -> None:
    from flows.commands.shared.console import err_console

    err_console.print(f"[yellow]{message}[/]", highlight=False, soft_wrap=True)


class Tracker:
    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        buffer_path: Path | str,
        *,
        timeout_s: float = 5.0,
        retry_every_s: float = 10.0,
        notify: Callable[[str], None] = _say,
        artifact_location: str | None = None,
    ) -> None:
        if tracking_uri.startswith("http"):
            # mlflow reads these per request; its default retries for minutes before failing.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(timeout_s))))
        if tracking_uri.startswith("sqlite:///"):
            Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.buffer_path = Path(buffer_path)
        self.client: MlflowClient | None = None
        self._damaged: str | None = None
        self._retry_every_s = retry_every_s
        self._notify = notify
        self._told = False
        self._last_try = 0.0
        self._experiment_id: str | None = None
        self._refs: dict[str, str] = {}
        # Where a new experiment keeps its artifacts; None lets the server (or mlflow's
        # default, ./mlruns under the current directory) decide.
        self.artifact_location = artifact_location
        try:
            self._connect()
        except Exception as exc:
            if not store_damaged(exc):
                raise
            self._note_damaged(exc)  # calls go to the journal; replayed once the store is repaired

    # ---- public API -------------------------------------------------------------------------

    @property
    def offline(self) -> bool:
        """True while calls are waiting in the local journal."""
        return self.buffer_path.exists() and self.buffer_path.stat().st_size > 0

    def start_run(
        self,
        name: str,
        *,
        parent: str | None = None,
        params: Mapping[str, object] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """A run id (or, while offline, a local reference that later maps to one)."""
        ref = OFFLINE_PREFIX + uuid.uuid4().hex
        created = self._call(CreateRun(ref, name, parent, tuple((str(k), str(v)) for k, v in (tags or {}).items())))
        run = created if isinstance(created, str) else ref
        if params:
            self.log_params(run, params)
        return run

    def log_params(self, run: str, params: Mapping[str, object]) -> None:
        items = tuple((str(k), str(v)) for k, v in params.items())
        for i in range(0, len(items), _MAX_PARAMS):
            self._call(LogBatch(run, params=items[i : i + _MAX_PARAMS]))

    def set_tags(self, run: str, tags: Mapping[str, object]) -> None:
        self._call(LogBatch(run, tags=tuple((str(k), str(v)) for k, v in tags.items())))

    def log_metrics(self, run: str, points: Iterable[MetricPoint]) -> None:
        now = int(time.time() * 1000)
        items = tuple((p.key, float(p.value), p.timestamp_ms if p.timestamp_ms is not None else now, int(p.step)) for p in points)
        for i in range(0, len(items), _MAX_METRICS):
            self._call(LogBatch(run, metrics=items[i : i + _MAX_METRICS]))

    def log_artifact(self, run: str, local_path: Path | str, artifact_path: str | None = None) -> None:
        self._call(LogArtifact(run, str(Path(local_path).resolve()), artifact_path))

    def log_artifacts(self, run: str, local_dir: Path | str, artifact_path: str | None = None) -> None:
        """A whole directory (e.g. an MLflow model) under ``artifact_path``."""
        self._call(LogArtifact(run, str(Path(local_dir).resolve()), artifact_path, directory=True))

    def log_text(self, run: str, text: str, name: str, artifact_path: str | None = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(text)
            self.log_artifact(run, path, artifact_path)

    def log_figure_file(self, run: str, png: Path | str) -> None:
        self.log_artifact(run, png, "figures")

    def end_run(self, run: str, status: str = "FINISHED") -> None:
        self._call(Terminate(run, status))

    def run_id(self, run: str) -> str | None:
        """The server's id for ``run`` (None while it exists only in the journal)."""
        return self._refs.get(run) if run.startswith(OFFLINE_PREFIX) else run

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """(step, value) of a metric another writer logged (e.g. a service's job run), in step
        order; empty when MLflow cannot be read now (a view, never worth failing a flow for)."""
        if self.offline:
            return []
        try:
            history = self._connect().get_metric_history(run_id, key)
        except Exception:  # noqa: BLE001 - see the docstring
            return []
        return sorted((m.step, m.value) for m in history)

    def flush(self) -> bool:
        """Replay the journal now; True when nothing is left waiting."""
        self._last_try = time.monotonic()
        if not self.offline:
            return True
        ops: list[JournalOp] = []
        for record in self._read_journal():
            if isinstance(record, RunRefs):
                self._refs.update(record.pairs)
            else:
                ops.append(record)
        for i, op in enumerate(ops):
            try:
                self._send(op)
            except Exception as exc:
                if not (_refused(exc) or unavailable(exc)):
                    raise
                self._rewrite([RunRefs(tuple(self._refs.items())), *ops[i:]])
                return False
        self.buffer_path.unlink(missing_ok=True)
        shutil.rmtree(self._artifact_dir(), ignore_errors=True)
        self._notify(f"MLflow at {redact_url(self.tracking_uri)} is reachable again: {len(ops)} buffered calls sent.")
        self._told = False
        return True

    # ---- internals --------------------------------------------------------------------------

    def _call(self, op: JournalOp) -> object:
        if self.offline and time.monotonic() - self._last_try >= self._retry_every_s:
            self.flush()
        if not self.offline:
            try:
                return self._send(op)
            except Exception as exc:
                refused = _refused(exc)
                damaged = store_damaged(exc)
                if damaged:
                    self._note_damaged(exc)  # says what to do itself
                elif not (refused or _unreachable(exc)):
                    raise
                if not self._told and not damaged:
                    why = (
                        f"refuses this client (403; start the server with --allowed-hosts listing "
                        f"{_host(self.tracking_uri)!r})"
                        if refused
                        else "is unreachable"
                    )
                    self._notify(
                        f"MLflow at {redact_url(self.tracking_uri)} (MALLEABLE_TRACKING_URI) {why}; training goes on and tracking "
                        f"calls are buffered in {self.buffer_path} until it answers."
                    )
                    self._told = True
                self._last_try = time.monotonic()
        self._append(op)
        return None

    def _connect(self) -> MlflowClient:
        if self.client is None:
            if self.tracking_uri.startswith("sqlite:///"):  # SQLite may not notice a truncated file until too late
                check_sqlite(Path(self.tracking_uri.removeprefix("sqlite:///")), "MLflow store", "the next command starts a fresh one")
            self.client = MlflowClient(self.tracking_uri)
            self._damaged = None
        return self.client

    def _note_damaged(self, exc: BaseException) -> None:
        """Say once what is broken and what to do; the caller then journals the call."""
        self.client = None
        if self._damaged is None:
            where = self.tracking_uri.removeprefix("sqlite:///")
            first = str(exc).splitlines()[0] if str(exc) else ""
            self._damaged = first if isinstance(exc, DamagedStateError) else (
                f"MLflow store {where} is damaged ({type(exc).__name__}: {first}); move it aside (mv {where} {where}.damaged): the next command starts a fresh one"
            )
            self._notify(f"{self._damaged}. Tracking calls are kept in {self.buffer_path} until then.")
            self._told = True

    def _read_journal(self) -> list[JournalOp | RunRefs]:
        """The journal's records; a torn or unreadable line (a write cut short by a crash) is skipped, the rest kept."""
        ops, torn = [], 0
        for line in self.buffer_path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise ValueError("not a record")
                ops.append(from_json(data))
            except ValueError:  # JSONDecodeError is one
                torn += 1
        if torn:
            self._notify(f"{self.buffer_path}: skipped {torn} damaged line(s) (a write cut short); {len(ops)} buffered call(s) kept.")
        return ops

    def _experiment(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = ensure_experiment(self._connect(), self.experiment, self.artifact_location)
        return self._experiment_id

    def _resolve(self, ref: str | None) -> str | None:
        if ref is None or not ref.startswith(OFFLINE_PREFIX):
            return ref
        if ref not in self._refs:
            raise ConnectionError(f"run {ref} not created yet")  # its create_run is still waiting
        return self._refs[ref]

    def _send(self, op: JournalOp) -> object:
        client = self._connect()
        if isinstance(op, CreateRun):
            tags = dict(op.tags)
            parent = self._resolve(op.parent)
            if parent is not None:
                tags[PARENT_TAG] = parent
            run = client.create_run(self._experiment(), run_name=op.name, tags=tags)
            self._refs[op.ref] = run.info.run_id
            return run.info.run_id
        run_id = self._resolve(op.run)
        assert run_id is not None
        if isinstance(op, LogBatch):
            client.log_batch(
                run_id,
                metrics=[Metric(k, v, ts, step) for k, v, ts, step in op.metrics],
                params=[Param(k, v) for k, v in op.params],
                tags=[RunTag(k, v) for k, v in op.tags],
            )
        elif isinstance(op, LogArtifact):
            if op.directory:
                client.log_artifacts(run_id, op.path, op.artifact_path)
            else:
                client.log_artifact(run_id, op.path, op.artifact_path)
        elif isinstance(op, Terminate):
            client.set_terminated(run_id, op.status)
        else:
            raise ValueError(f"journal op={op!r}: unknown")
        return None

    def _artifact_dir(self) -> Path:
        return self.buffer_path.with_name(self.buffer_path.name + ".artifacts")

    def _append(self, op: JournalOp) -> None:
        if isinstance(op, LogArtifact):
            # The original may be temporary; keep a copy until the server has it.
            dest = self._artifact_dir() / uuid.uuid4().hex / Path(op.path).name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if op.directory:
                shutil.copytree(op.path, dest)
            else:
                shutil.copy2(op.path, dest)
            op = replace(op, path=str(dest))
        self.buffer_path.parent.mkdir(parents=True, exist_ok=True)
        with self.buffer_path.open("a", encoding="utf-8") as f:
            f.write(to_json(op) + "\n")

    def _rewrite(self, records: Sequence[JournalOp | RunRefs]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.buffer_path.parent, prefix=".buffer-", suffix=".jsonl")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for record in records:
                f.write(to_json(record) + "\n")
        os.replace(tmp, self.buffer_path)


def tracker_from_settings(settings: object, **kwargs: object) -> Tracker:
    """A Tracker configured from ``flows.config.settings.Settings``."""
    from flows.config.settings import Settings

    assert isinstance(settings, Settings)
    # With the embedded sqlite store, artifacts live beside it in the state directory rather
    # than in ./mlruns of wherever the command ran.
    artifacts = None if settings.tracking_uri else (settings.state_dir / "mlartifacts").resolve().as_uri()
    return Tracker(
        settings.resolved_tracking_uri,
        settings.experiment,
        settings.buffer_path,
        timeout_s=settings.tracking_timeout_s,
        artifact_location=artifacts,
        **kwargs,  # type: ignore[arg-type]
    )
