"""MLflow for the service: one run per job (schedule and training metrics logged as they happen),
one run for the service itself (GPUs alive and in use, jobs queued, over time).

MLflow being down must neither stop the scheduler nor lose what it records. The calls go through
``BufferedTracker`` (``service.tracking.buffered``), the flows' own policy: a call the tracking
store cannot take now — a server unreachable, a sqlite file whose directory is gone or not
writable, a database locked or damaged — is said once and journaled with every later one, in
order, in ``journal`` (``service_journal``: beside the job store). The journal is replayed in
order by the next call after ``retry_every_s``, every ``retry_every_s`` while the service is
idle, and at ``close``; what ``close`` could not send waits for the next service on the same job
store. A call MLflow itself refuses (a bad value) is reported and dropped, the rest go on.

Every MLflow call runs on one thread of its own, in the order the service made them, so the loop
never waits on MLflow: not on importing it and opening its store (seconds, most of a service's
start after a crash: issue 28, recovery), nor on a slow or absent tracking server. A new job
run's id reaches the job store through ``on_run`` once MLflow made it (for a journaled run, when
it is replayed); ``close`` waits (bounded) until every call made before it is sent or journaled.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.tracking.buffered import BufferedTracker
    from service.tracking.journal import CreateRun, JournalOp

log = logging.getLogger(__name__)
JOURNAL_NAME = "mlflow-service-buffer.jsonl"
_SQLITE_FILE = re.compile(r"sqlite(\+\w+)?:///(?P<path>[^?]+)")


def service_journal(store_url: str, state_dir: Path | str | None = None) -> Path:
    """Where a service on the job store ``store_url`` journals its MLflow calls: beside a sqlite
    store's file (the state directory), else in ``state_dir`` (a persistent volume on Kubernetes:
    a pod restart must find it to replay it) or, without one, the temporary directory, under a
    name of the store's. One service holds a store's lease at a time, so a journal has one
    writer, and the next service on the store replays what the last one could not send."""
    found = _SQLITE_FILE.fullmatch(store_url)
    if found and found["path"] != ":memory:":
        return Path(found["path"]).parent / JOURNAL_NAME
    digest = hashlib.sha256(store_url.encode()).hexdigest()[:16]
    where = Path(state_dir) if state_dir is not None else Path(tempfile.gettempdir()) / "malleable"
    return where / f"mlflow-service-buffer-{digest}.jsonl"


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


class ServiceTracking:
    # A backlog beyond this (a tracking server far slower than the service's metrics) goes to the
    # journal rather than memory until it is down to a tenth; the replay sends it.
    MAX_PENDING = 10_000
    CLOSE_WAIT_S = 60.0
    _REPORTED = 3  # refused or lost calls reported one by one; the rest are counted at close

    def __init__(
        self,
        tracking_uri: str | None,
        experiment: str = "malleable",
        warn: Callable[[str], None] | None = None,
        job_tags: dict[str, str] | None = None,
        on_run: Callable[[str, str], None] | None = None,
        journal: Path | str | None = None,
        retry_every_s: float = 10.0,
        artifact_location: str | None = None,
    ) -> None:
        """``on_run(job_id, run_id)``: called (on the MLflow thread) when a job's new run exists.
        ``journal``: None keeps the journal in a temporary file of this process's own (nothing
        carries over to the next service)."""
        # Every job run's tags besides its own: ``malleable.mode`` (as ``malleable run``'s runs carry
        # it, so ``malleable compare`` finds service jobs) and what the service adds (its policy).
        self._job_tags = {"malleable.mode": "service", **(job_tags or {})}
        self._experiment = experiment
        self._journal = Path(journal) if journal is not None else Path(tempfile.gettempdir()) / f"malleable-service-mlflow-{uuid.uuid4().hex}.jsonl"
        self._retry_every_s = retry_every_s
        self._artifact_location = artifact_location  # of the experiment, if this service creates it
        # Touched on the MLflow thread only: each job's open run, and the run this service made
        # for each job (kept after it ends: a job that resumes continues it).
        self._runs: dict[str, str] = {}
        self._made: dict[str, str] = {}
        self._service_run: str | None = None
        self._tracker: BufferedTracker | None = None
        self._warn = warn or log.warning
        self._on_run = on_run
        self._enabled = tracking_uri is not None
        self._behind = False
        self._refused = self._lost = 0
        self._calls: queue.Queue[Callable[[BufferedTracker], object] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if tracking_uri is None:
            return
        self._thread = threading.Thread(target=self._work, args=(tracking_uri,), daemon=True, name="malleable-mlflow")
        self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def journal(self) -> Path:
        return self._journal

    # ---- the MLflow thread ------------------------------------------------------------------

    def _work(self, tracking_uri: str) -> None:
        try:
            from service.tracking.buffered import BufferedTracker
            from service.tracking.failures import store_unavailable

            self._tracker = BufferedTracker(
                tracking_uri, self._experiment, self._journal, retry_every_s=self._retry_every_s, notify=self._warn, artifact_location=self._artifact_location,
                unavailable=store_unavailable, on_rejected=self._rejected, on_created=self._created,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a URI MLflow cannot use at all (not a store that is away)
            self._enabled = False
            self._warn(f"MLflow tracking is off for this service: {_first_line(exc)}")
        tracker = self._tracker
        while True:
            try:
                fn = self._calls.get(timeout=self._retry_every_s if tracker is not None and tracker.offline else None)
            except queue.Empty:
                self._guard(tracker.flush)  # idle while calls wait: replay them now
                continue
            if fn is None:
                break
            if tracker is None:
                continue  # off: the calls still queued are dropped
            self._pace(tracker)
            self._guard(lambda: fn(tracker))
        if tracker is not None and tracker.offline:
            tracker.hold(False)
            self._guard(tracker.flush)
            if tracker.offline:
                self._warn(f"MLflow still cannot take this service's tracking calls: they wait in {self._journal}, and the next service on this job store sends them")
        if self._refused > self._REPORTED or self._lost > self._REPORTED:
            self._warn(f"MLflow tracking: {self._refused} call(s) refused by MLflow, {self._lost} lost, in all")

    def _pace(self, tracker: BufferedTracker) -> None:
        backlog = self._calls.qsize()
        if not self._behind and backlog >= self.MAX_PENDING:
            self._behind = True
            tracker.hold(True)
            self._warn(f"MLflow is far behind the service ({backlog} calls waiting): calls go to {self._journal} until it catches up")
        elif self._behind and backlog <= self.MAX_PENDING // 10:
            self._behind = False
            tracker.hold(False)

    def _guard(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the journal itself failed (its disk): this call is lost, tracking goes on
            self._lost += 1
            if self._lost <= self._REPORTED:
                self._warn(f"an MLflow tracking call is lost: it could neither be sent nor journaled ({_first_line(exc)})")

    def _rejected(self, op: JournalOp, exc: BaseException) -> None:
        self._refused += 1
        if self._refused <= self._REPORTED:
            self._warn(f"MLflow refused a tracking call ({type(op).__name__} of run {getattr(op, 'run', None) or getattr(op, 'ref', '?')}), dropped: {_first_line(exc)}")

    def _created(self, op: CreateRun, run_id: str) -> None:
        tags = dict(op.tags)
        job_id = tags.get("malleable.job_id")
        if tags.get("malleable.kind") != "service-job" or job_id is None:
            return
        # A run replayed from an earlier service's journal: a resume here continues it.
        self._made.setdefault(job_id, run_id)
        if self._on_run is not None:
            try:
                self._on_run(job_id, run_id)
            except Exception as exc:  # noqa: BLE001 - the job store's trouble, not MLflow's: tracking goes on
                self._warn(f"job {job_id}: its MLflow run {run_id} is not recorded in the job store ({type(exc).__name__})")

    # ---- what the service calls (from the loop: each returns at once) ----------------------

    def _call(self, fn: Callable[[BufferedTracker], object]) -> None:
        if self._enabled:
            self._calls.put(fn)

    def service_started(self, params: dict[str, str]) -> None:
        name = f"service-{time.strftime('%Y%m%d-%H%M%S')}"

        def go(t: BufferedTracker) -> None:
            self._service_run = t.start_run(name, params=params, tags={"malleable.kind": "service"})

        self._call(go)

    def job_run(
        self, job_id: str, name: str, existing: str | None, params: dict[str, object], parent: str | None = None, submitter: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> str | None:
        """The job's run: its earlier one when it resumes (returned now), else a new one (nested
        under ``parent``, e.g. the HPO trial or the cluster flow that submitted it), whose id goes
        to ``on_run`` once MLflow has made it (None is returned)."""

        def go(t: BufferedTracker) -> None:
            # Resumed before its id reached the store (its run still journaled): the same run.
            earlier = existing or self._made.get(job_id)
            if earlier:
                t.reopen_run(earlier)
                self._runs[job_id] = earlier
                return
            run_tags = {**self._job_tags, **(tags or {}), "malleable.kind": "service-job", "malleable.job_id": job_id, "malleable.name": name}
            if submitter:
                run_tags["malleable.submitter"] = submitter
            run = t.start_run(f"{name}-{job_id}", parent=parent, params={k: str(v)[:500] for k, v in params.items()}, tags=run_tags)
            self._runs[job_id] = self._made[job_id] = run

        self._call(go)
        return existing if self._enabled else None

    def metrics(self, job_id: str | None, values: dict[str, float | None], step: int = 0) -> None:
        """Log ``values``; one that is None (never measured) or NaN is left out, not logged as a number."""
        self._log(job_id, values, step, int(time.time() * 1000))

    def job_final(self, job_id: str, values: dict[str, float], when_ms: int) -> None:
        """The job's end values (``service.job_metrics``), logged once as it ends, at step 0."""
        self._log(job_id, values, 0, when_ms)

    def _log(self, job_id: str | None, values: dict[str, float | None], step: int, when_ms: int) -> None:
        def go(t: BufferedTracker) -> None:
            from service.tracking.buffered import MetricPoint

            run = self._service_run if job_id is None else self._runs.get(job_id)
            points = [MetricPoint(k, float(v), step, when_ms) for k, v in values.items() if v is not None and v == v]
            if run is not None and points:
                t.log_metrics(run, points)

        self._call(go)

    def job_ended(self, job_id: str, status: str, error: str | None = None, texts: dict[str, str] | None = None) -> None:
        """End the job's run with ``status``; ``error`` (a failed job's) as the tag
        ``malleable.error`` and the artifact ``error.txt``; ``texts`` (name -> content, e.g. the
        schedule CSV) as artifacts. Files are written beside the journal, not in a temporary
        directory: a call MLflow cannot take now is replayed later, from there."""
        texts = dict(texts or {})
        if error:
            texts["error.txt"] = error
        spool = self._journal.parent / f"{self._journal.stem}-artifacts" / job_id
        paths = []
        if self._enabled and texts:
            try:
                spool.mkdir(parents=True, exist_ok=True)
                for name, text in texts.items():
                    (spool / name).write_text(text)
                    paths.append(spool / name)
            except OSError as exc:
                self._warn(f"job {job_id}: its MLflow artifacts could not be written at {spool}: {exc.strerror}")
                paths = []

        def go(t: BufferedTracker) -> None:
            run = self._runs.pop(job_id, None)
            if run is not None:
                if error:
                    t.set_tags(run, {"malleable.error": error[:5000]})  # MLflow's limit on a tag's value
                for path in paths:
                    t.log_artifact(run, path)
                t.end_run(run, status)

        self._call(go)

    def close(self, status: str = "FINISHED") -> None:
        """Every run still open ended (jobs KILLED, the service's with ``status``), then the calls
        made so far sent, or kept in the journal: waits up to ``CLOSE_WAIT_S`` for MLflow."""
        if self._thread is None:
            return

        def go(t: BufferedTracker) -> None:
            for job_id in list(self._runs):
                t.end_run(self._runs.pop(job_id), "KILLED")
            if self._service_run is not None:
                t.end_run(self._service_run, status)

        self._call(go)
        self._calls.put(None)
        self._thread.join(timeout=self.CLOSE_WAIT_S)
        if self._thread.is_alive():
            self._warn(f"MLflow did not take the service's last tracking calls within {self.CLOSE_WAIT_S:g} s: some may be lost")
        self._thread = None
