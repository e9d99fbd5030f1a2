"""Prefect tasks that are clients of a scheduler service, and how a flow finds a running one.

A flow submits to the configured service when one runs (``MALLEABLE_JOB_STORE`` set and its
lease held by a live service); otherwise it schedules through an embedded one for the run.
A submission's idempotency key is its task run's id, which Prefect keeps across retries: a
retried ``submit-job`` returns the job the first try created instead of a second one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from prefect import task
from prefect.cache_policies import NO_CACHE

from allocator.types import JobSpec
from flows.config.settings import Settings
from service.client import ServiceClient
from service.store.lease import Lease
from service.store.records import JobRow
from service.store import JobStore, StoreError

if TYPE_CHECKING:
    from service.embedded import EmbeddedService


def live_service(settings: Settings) -> str | None:
    """The configured job store, if a service is scheduling it now."""
    if not settings.job_store:
        return None
    try:
        store = JobStore(settings.job_store, create=False)
    except StoreError:
        return None
    try:
        info = Lease(store).info()
    finally:
        store.close()
    return settings.job_store if info.holder is not None and info.expires_at > time.time() else None


def _task_key(prefix: str) -> str:
    from prefect.runtime import task_run

    return f"{prefix}:{task_run.id}"


@task(name="submit-job", retries=3, retry_delay_seconds=2, cache_policy=NO_CACHE)
def submit_job(store_url: str, spec: JobSpec, submitter: str = "prefect", mlflow_parent_run_id: str | None = None) -> str:
    """Submit one job to the service; a retry of this task run returns the same job id."""
    client = ServiceClient(store_url, submitter=submitter)
    key = f"{_task_key('prefect')}:{spec.id}"
    return client.submit_spec(spec, idempotency_key=key, mlflow_parent_run_id=mlflow_parent_run_id).job_id


@task(name="wait-for-jobs", cache_policy=NO_CACHE)
def wait_for_jobs(store_url: str, job_ids: Sequence[str], timeout_s: float | None = None) -> list[JobRow]:
    return ServiceClient(store_url).wait(list(job_ids), timeout_s)


def submit_at_arrivals(store_url: str, specs: Sequence[JobSpec], submitter: str, mlflow_parent_run_id: str | None = None) -> dict[str, str]:
    """Submit each job at its ``arrival_time`` (seconds from now) through ``submit_job``; name -> id.
    ``mlflow_parent_run_id``: the service nests each job's MLflow run under that run."""
    t0 = time.monotonic()
    ids = {}
    for spec in sorted(specs, key=lambda s: (s.arrival_time, s.id)):
        delay = t0 + spec.arrival_time - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        ids[spec.id] = submit_job(store_url, spec, submitter, mlflow_parent_run_id)
    return ids


def service_gpus(store_url: str) -> int | None:
    """The GPU workers of the cluster the service holding ``store_url`` drives (None: not known,
    e.g. its scheduler is not reachable from here)."""
    from distributed import Client

    from elastic_tasks.cluster import gpu_workers

    store = JobStore(store_url, create=False)
    try:
        address = Lease(store).info().cluster_address
    finally:
        store.close()
    if not address:
        return None
    try:
        with Client(address, timeout=3, set_as_default=False) as client:
            return len(gpu_workers(client))
    except (OSError, TimeoutError):
        return None


class JobSession(Protocol):
    """What a flow that submits and waits needs of a scheduler service, running or embedded."""

    def submit(self, spec: JobSpec, mlflow_parent_run_id: str | None = None) -> str: ...

    def wait(self, job_ids: Sequence[str], timeout_s: float | None = None) -> list[JobRow]: ...

    def cancel(self, job_ids: Sequence[str]) -> None: ...


class LiveSession:
    """A team's running service: submissions through the ``submit-job`` task (retried, idempotent)."""

    def __init__(self, store_url: str, submitter: str) -> None:
        self.store_url, self.submitter = store_url, submitter
        self.client = ServiceClient(store_url, submitter=submitter)

    def submit(self, spec: JobSpec, mlflow_parent_run_id: str | None = None) -> str:
        return submit_job(self.store_url, spec, self.submitter, mlflow_parent_run_id)

    def wait(self, job_ids: Sequence[str], timeout_s: float | None = None) -> list[JobRow]:
        return self.client.wait(list(job_ids), timeout_s)

    def cancel(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            self.client.cancel(job_id)


class EmbeddedSession:
    """A service for this run only; ``key_prefix`` (unique per run) + the job's name keys each submission."""

    def __init__(self, service: EmbeddedService, key_prefix: str) -> None:
        self.service, self.key_prefix = service, key_prefix

    def submit(self, spec: JobSpec, mlflow_parent_run_id: str | None = None) -> str:
        return self.service.jobs.submit_spec(spec, idempotency_key=f"{self.key_prefix}:{spec.id}", mlflow_parent_run_id=mlflow_parent_run_id).job_id

    def wait(self, job_ids: Sequence[str], timeout_s: float | None = None) -> list[JobRow]:
        return self.service.wait(job_ids, timeout_s=timeout_s)

    def cancel(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            self.service.jobs.cancel(job_id)
