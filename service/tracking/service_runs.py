"""MLflow for the service: one run per job (schedule and training metrics logged as they happen),
one run for the service itself (GPUs alive and in use, jobs queued, over time).

MLflow being down must not stop the scheduler: the first failure is reported once and
tracking is switched off for the rest of the service's life.

Every MLflow call runs on one thread of its own, in the order the service made them, so the
loop never waits on MLflow: not on importing it and opening its store (seconds, most of a
service's start after a crash: issue 28, recovery), nor on a slow tracking server. A new job
run's id reaches the job store through ``on_run`` once MLflow made it; ``close`` waits (bounded)
until every call made before it is sent.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def ensure_experiment(client: object, name: str, artifact_location: str | None = None) -> str:
    """The experiment's id, creating it if missing. Two writers starting at once (a flow and the
    service it submits to, two submitters) both find it missing; the loser of the create reads
    the winner's instead of failing."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


class ServiceTracking:
    # Calls waiting for the MLflow thread beyond this are dropped (a tracking server far slower
    # than the service's metrics): memory stays bounded; the first drop is reported.
    MAX_PENDING = 10_000
    CLOSE_WAIT_S = 60.0

    def __init__(
        self,
        tracking_uri: str | None,
        experiment: str = "malleable",
        warn: Callable[[str], None] | None = None,
        job_tags: dict[str, str] | None = None,
        on_run: Callable[[str, str], None] | None = None,
    ) -> None:
        """``on_run(job_id, run_id)``: called (on the MLflow thread) when a job's new run exists."""
        # Every job run's tags besides its own: ``malleable.mode`` (as ``malleable run``'s runs carry
        # it, so ``malleable compare`` finds service jobs) and what the service adds (its policy).
        self._job_tags = {"malleable.mode": "service", **(job_tags or {})}
        self._client = None
        self._experiment_id: str | None = None
        self._runs: dict[str, str] = {}  # touched on the MLflow thread only
        self._service_run: str | None = None
        self._warn = warn or log.warning
        self._on_run = on_run
        self._enabled = tracking_uri is not None
        self._dropped = False
        self._calls: queue.Queue[Callable[[], object] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if tracking_uri is None:
            return
        self._thread = threading.Thread(target=self._work, args=(tracking_uri, experiment), daemon=True, name="malleable-mlflow")
        self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def _work(self, tracking_uri: str, experiment: str) -> None:
        try:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri)
            self._experiment_id = ensure_experiment(self._client, experiment)
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            self._off(exc)
        while (fn := self._calls.get()) is not None:
            if self._client is None:
                continue  # off: the calls still queued are dropped
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                self._off(exc)

    def _off(self, exc: BaseException) -> None:
        self._client = None
        self._enabled = False
        self._warn(f"MLflow tracking is off for this service: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    def _call(self, fn: Callable[[], object]) -> None:
        if not self._enabled:
            return
        if self._calls.qsize() >= self.MAX_PENDING:
            if not self._dropped:
                self._dropped = True
                self._warn(f"MLflow is far behind the service ({self.MAX_PENDING} calls waiting): dropping tracking calls until it catches up")
            return
        self._calls.put(fn)

    def service_started(self, params: dict[str, str]) -> None:
        def go() -> None:
            run = self._client.create_run(self._experiment_id, run_name=f"service-{time.strftime('%Y%m%d-%H%M%S')}", tags={"malleable.kind": "service"})
            self._service_run = run.info.run_id
            for k, v in params.items():
                self._client.log_param(self._service_run, k, v)

        self._call(go)

    def job_run(
        self, job_id: str, name: str, existing: str | None, params: dict[str, object], parent: str | None = None, submitter: str | None = None
    ) -> str | None:
        """The job's run: its earlier one when it resumes (returned now), else a new one (nested
        under ``parent``, e.g. the HPO trial or the cluster flow that submitted it), whose id goes
        to ``on_run`` once MLflow has made it (None is returned)."""

        def go() -> None:
            from mlflow.entities import Param

            if existing:
                self._client.update_run(existing, status="RUNNING")
                self._runs[job_id] = existing
                return
            tags = {**self._job_tags, "malleable.kind": "service-job", "malleable.job_id": job_id, "malleable.name": name}
            if submitter:
                tags["malleable.submitter"] = submitter
            if parent:
                tags["mlflow.parentRunId"] = parent
            run = self._client.create_run(self._experiment_id, run_name=f"{name}-{job_id}", tags=tags)
            self._runs[job_id] = run.info.run_id
            self._client.log_batch(run.info.run_id, params=[Param(k, str(v)[:500]) for k, v in params.items()])
            if self._on_run is not None:
                try:
                    self._on_run(job_id, run.info.run_id)
                except Exception as exc:  # noqa: BLE001 - the job store's trouble, not MLflow's: tracking stays on
                    self._warn(f"job {job_id}: its MLflow run {run.info.run_id} is not recorded in the job store ({type(exc).__name__})")

        self._call(go)
        return existing if self._enabled else None

    def metrics(self, job_id: str | None, values: dict[str, float | None], step: int = 0) -> None:
        """Log ``values``; one that is None (never measured) or NaN is left out, not logged as a number."""
        now = int(time.time() * 1000)

        def go() -> None:
            from mlflow.entities import Metric

            run_id = self._service_run if job_id is None else self._runs.get(job_id)
            if run_id is not None:
                self._client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items() if v is not None and v == v])

        self._call(go)

    def job_final(self, job_id: str, values: dict[str, float], when_ms: int) -> None:
        """The job's end values (``service.job_metrics``), logged once as it ends, at step 0."""

        def go() -> None:
            from mlflow.entities import Metric

            run_id = self._runs.get(job_id)
            if run_id is not None:
                self._client.log_batch(run_id, metrics=[Metric(k, float(v), when_ms, 0) for k, v in values.items() if v == v])

        self._call(go)

    def job_ended(self, job_id: str, status: str) -> None:
        def go() -> None:
            run_id = self._runs.pop(job_id, None)
            if run_id is not None:
                self._client.set_terminated(run_id, status=status)

        self._call(go)

    def close(self, status: str = "FINISHED") -> None:
        """Every run still open ended (jobs KILLED, the service's with ``status``), then the calls
        made so far sent: waits up to ``CLOSE_WAIT_S`` for MLflow."""
        if self._thread is None:
            return

        def go() -> None:
            for job_id in list(self._runs):
                self._client.set_terminated(self._runs.pop(job_id), status="KILLED")
            if self._service_run is not None:
                self._client.set_terminated(self._service_run, status=status)

        self._call(go)
        self._calls.put(None)
        self._thread.join(timeout=self.CLOSE_WAIT_S)
        if self._thread.is_alive():
            self._warn(f"MLflow did not take the service's last tracking calls within {self.CLOSE_WAIT_S:g} s: some are lost")
        self._thread = None
