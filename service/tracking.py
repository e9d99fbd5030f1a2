"""MLflow for the service: one run per job (schedule and training metrics logged as they happen),
one run for the service itself (GPUs alive and in use, jobs queued, over time).

MLflow being down must not stop the scheduler: the first failure is reported once and
tracking is switched off for the rest of the service's life.
"""

from __future__ import annotations

import logging
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
    def __init__(
        self, tracking_uri: str | None, experiment: str = "malleable", warn: Callable[[str], None] | None = None, job_tags: dict[str, str] | None = None
    ) -> None:
        # Every job run's tags besides its own: ``malleable.mode`` (as ``malleable run``'s runs carry
        # it, so ``malleable compare`` finds service jobs) and what the service adds (its policy).
        self._job_tags = {"malleable.mode": "service", **(job_tags or {})}
        self._client = None
        self._experiment_id: str | None = None
        self._runs: dict[str, str] = {}
        self._service_run: str | None = None
        self._warn = warn or log.warning
        if tracking_uri is None:
            return
        try:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri)
            self._experiment_id = ensure_experiment(self._client, experiment)
        except Exception as exc:  # noqa: BLE001 - see the module docstring
            self._off(exc)

    @property
    def enabled(self) -> bool:
        return self._client is not None

    def _off(self, exc: BaseException) -> None:
        self._client = None
        self._warn(f"MLflow tracking is off for this service: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    def _call(self, fn: Callable[[], object]) -> object:
        if self._client is None:
            return None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001
            self._off(exc)
            return None

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
        """The job's run: its earlier one when it resumes, else a new one (nested under ``parent``,
        e.g. the HPO trial or the cluster flow that submitted it)."""

        def go() -> str:
            from mlflow.entities import Param

            if existing:
                self._client.update_run(existing, status="RUNNING")
                run_id = existing
            else:
                tags = {**self._job_tags, "malleable.kind": "service-job", "malleable.job_id": job_id, "malleable.name": name}
                if submitter:
                    tags["malleable.submitter"] = submitter
                if parent:
                    tags["mlflow.parentRunId"] = parent
                run = self._client.create_run(self._experiment_id, run_name=f"{name}-{job_id}", tags=tags)
                run_id = run.info.run_id
                self._client.log_batch(run_id, params=[Param(k, str(v)[:500]) for k, v in params.items()])
            self._runs[job_id] = run_id
            return run_id

        return self._call(go)  # type: ignore[return-value]

    def metrics(self, job_id: str | None, values: dict[str, float | None], step: int = 0) -> None:
        """Log ``values``; one that is None (never measured) or NaN is left out, not logged as a number."""
        run_id = self._service_run if job_id is None else self._runs.get(job_id)
        if run_id is None:
            return

        def go() -> None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self._client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items() if v is not None and v == v])

        self._call(go)

    def job_final(self, job_id: str, values: dict[str, float], when_ms: int) -> None:
        """The job's end values (``service.job_metrics``), logged once as it ends, at step 0."""
        run_id = self._runs.get(job_id)
        if run_id is None:
            return

        def go() -> None:
            from mlflow.entities import Metric

            self._client.log_batch(run_id, metrics=[Metric(k, float(v), when_ms, 0) for k, v in values.items() if v == v])

        self._call(go)

    def job_ended(self, job_id: str, status: str) -> None:
        run_id = self._runs.pop(job_id, None)
        if run_id is not None:
            self._call(lambda: self._client.set_terminated(run_id, status=status))

    def close(self, status: str = "FINISHED") -> None:
        for job_id in list(self._runs):
            self.job_ended(job_id, "KILLED")
        if self._service_run is not None:
            self._call(lambda: self._client.set_terminated(self._service_run, status=status))
