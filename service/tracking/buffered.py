"""MLflow through ``MlflowClient``, with a local journal for when the tracking store is away: the
one failure policy of the flows (``flows.recording.tracking.Tracker``) and the service
(``service.tracking.ServiceTracking``).

The work being recorded must never stop because the tracking store did. Every call goes through
``BufferedTracker``: while the store answers, calls go straight to it; when a call fails because
the store cannot be used (``unavailable``: a server unreachable or refusing this client, a local
store damaged; the service passes a wider reading), the user is told once, that call and every
later one are appended to a JSONL journal on local disk (artifacts copied beside it), and each
later call first tries — at most every ``retry_every_s`` — to replay the journal in order. Runs
created while offline get a local reference (``offline-…``) that the replay maps to the real run
id; the map is kept in the journal, so a later process (the next ``malleable`` command, the next
service) can finish a flush this one could not.

A call MLflow answers with a refusal (a bad value) raises, or, given ``on_rejected``, is reported
there and skipped, so that it cannot hold the journal behind it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from service.redaction import redact_url
from service.tracking.experiment import ensure_experiment
from service.tracking.failures import StoreDamagedError, host, refused, store_damaged, unavailable, unreachable
from service.tracking.journal import CreateRun, JournalOp, LogArtifact, LogBatch, Reopen, RunRefs, Terminate, from_json, to_json

PARENT_TAG = "mlflow.parentRunId"
OFFLINE_PREFIX = "offline-"
# log_batch accepts at most 1000 metrics and 100 params per call.
_MAX_METRICS, _MAX_PARAMS = 1000, 100
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MetricPoint:
    key: str
    value: float
    step: int = 0
    timestamp_ms: int | None = None


class BufferedTracker:
    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        buffer_path: Path | str,
        *,
        timeout_s: float = 5.0,
        retry_every_s: float = 10.0,
        notify: Callable[[str], None] = log.warning,
        artifact_location: str | None = None,
        check_store: Callable[[str], None] | None = None,
        unavailable: Callable[[BaseException], bool] = unavailable,
        on_rejected: Callable[[JournalOp, BaseException], None] | None = None,
        on_created: Callable[[CreateRun, str], None] | None = None,
    ) -> None:
        """``check_store(uri)`` runs before each connection and raises ``StoreDamagedError`` for a
        store it finds damaged; ``unavailable(exc)`` says which failures are the store's (the call
        is journaled; a 403 always is); ``on_rejected(op, exc)`` takes the others instead of the
        caller; ``on_created(op, run_id)`` hears of each run the store makes, replayed ones too."""
        if tracking_uri.startswith("http"):
            # mlflow reads these per request; its default retries for minutes before failing.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(timeout_s))))
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
        self._check_store = check_store
        self._unavailable = unavailable
        self._on_rejected = on_rejected
        self._on_created = on_created
        self._lost: set[str] = set()  # offline refs whose creation MLflow refused
        self._holding = False
        # Where a new experiment keeps its artifacts; None lets the server (or mlflow's
        # default, ./mlruns under the current directory) decide.
        self.artifact_location = artifact_location
        try:
            self._connect()
        except Exception as exc:
            if store_damaged(exc):
                self._note_damaged(exc)  # calls go to the journal; replayed once the store is repaired
            elif self._store_failed(exc):
                self._note_unavailable(exc)
            else:
                raise

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

    def reopen_run(self, run: str) -> None:
        """Mark an ended run running again (a resumed job continues its run)."""
        self._call(Reopen(run))

    def hold(self, on: bool) -> None:
        """While on, every call goes to the journal without trying the store (a caller far
        behind a slow store keeps its backlog on disk, not in memory); the replay sends them."""
        self._holding = on

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
        if self._on_rejected is not None:
            # A run whose creation was refused, or dropped from an earlier journal, never gets an
            # id: its calls are refused too rather than waiting for it forever.
            made = {op.ref for op in ops if isinstance(op, CreateRun)}
            self._lost |= {op.run for op in ops if not isinstance(op, CreateRun) and op.run.startswith(OFFLINE_PREFIX)} - made - set(self._refs)
        for i, op in enumerate(ops):
            try:
                self._send(op)
            except Exception as exc:
                if not self._store_failed(exc):
                    self._reject(op, exc)
                    continue
                self._rewrite([RunRefs(tuple(self._refs.items())), *ops[i:]])
                return False
        self.buffer_path.unlink(missing_ok=True)
        shutil.rmtree(self._artifact_dir(), ignore_errors=True)
        self._notify(f"MLflow at {redact_url(self.tracking_uri)} is reachable again: {len(ops)} buffered calls sent.")
        self._told = False
        return True

    # ---- internals --------------------------------------------------------------------------

    def _store_failed(self, exc: BaseException) -> bool:
        return refused(exc) or self._unavailable(exc)

    def _reject(self, op: JournalOp, exc: BaseException) -> None:
        """MLflow refused ``op`` itself: the caller's error, or ``on_rejected``'s to report."""
        if self._on_rejected is None:
            raise exc
        if isinstance(op, CreateRun):
            self._lost.add(op.ref)
        self._on_rejected(op, exc)

    def _call(self, op: JournalOp) -> object:
        if self._holding:
            self._append(op)
            return None
        if self.offline and time.monotonic() - self._last_try >= self._retry_every_s:
            self.flush()
        if not self.offline:
            try:
                return self._send(op)
            except Exception as exc:
                if store_damaged(exc):
                    self._note_damaged(exc)  # says what to do itself
                elif self._store_failed(exc):
                    self._note_unavailable(exc)
                else:
                    self._reject(op, exc)
                    return None
                self._last_try = time.monotonic()
        self._append(op)
        return None

    def _note_unavailable(self, exc: BaseException) -> None:
        """Say once that the store cannot be used and where the calls wait."""
        if self._told:
            return
        if refused(exc):
            why = f"refuses this client (403; start the server with --allowed-hosts listing {host(self.tracking_uri)!r})"
        elif unreachable(exc):
            why = "is unreachable"
        else:
            why = f"cannot be used now ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
        self._notify(
            f"MLflow at {redact_url(self.tracking_uri)} (MALLEABLE_TRACKING_URI) {why}; training goes on and tracking "
            f"calls are buffered in {self.buffer_path} until it answers."
        )
        self._told = True

    def _connect(self) -> MlflowClient:
        if self.client is None:
            if self.tracking_uri.startswith("sqlite:///"):
                Path(self.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            if self._check_store is not None:  # e.g. SQLite may not notice a truncated file until too late
                self._check_store(self.tracking_uri)
            self.client = MlflowClient(self.tracking_uri)
            self._damaged = None
        return self.client

    def _note_damaged(self, exc: BaseException) -> None:
        """Say once what is broken and what to do; the caller then journals the call."""
        self.client = None
        if self._damaged is None:
            where = self.tracking_uri.removeprefix("sqlite:///")
            first = str(exc).splitlines()[0] if str(exc) else ""
            self._damaged = first if isinstance(exc, StoreDamagedError) else (
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
        if ref in self._lost:
            raise LookupError(f"run {ref}: MLflow refused to create it")
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
            if self._on_created is not None:
                self._on_created(op, run.info.run_id)
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
        elif isinstance(op, Reopen):
            client.update_run(run_id, status="RUNNING")
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


