"""A service for one run, inside the caller's process: what ``malleable run``, the quickstart and
the flows use when no service is configured, so that a run and a team's service schedule with
the same code (the store, the loop, the executor), not two."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence

from distributed import Client

from allocator.loop import LoopResult, StepReport
from allocator.types import JobSpec
from elastic_tasks.coordinator.outcomes import JobResult
from service.client import ServiceClient, wait_until_done
from service.store.records import JobRow
from service.runner import Service, ServiceConfig


class ServiceDied(RuntimeError):
    """The embedded service stopped with an error while jobs were still waiting on it."""


class EmbeddedService:
    def __init__(self, config: ServiceConfig, client: Client, say: Callable[[str], None] = lambda _line: None, observer: Callable[[StepReport], None] | None = None) -> None:
        self.service = Service(config, say=say)
        self.client, self.observer = client, observer
        # Decisions are made on the service's thread but reported on the caller's: a Prefect flow
        # attributes prints, logs and artifacts to its run only from its own thread.
        self._reports: queue.SimpleQueue[StepReport] = queue.SimpleQueue()
        self.jobs = ServiceClient(self.service.store, submitter="embedded")
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> EmbeddedService:
        self.service.acquire()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="malleable-embedded-service")
        self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            self.service.run(self.client, cluster_owned=False, observer=self._reports.put)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            self._error = exc

    def __exit__(self, *exc: object) -> None:
        self.service.stop()
        if self._thread is not None:
            self._thread.join()
        self.service.lease.release()
        self._pump()
        if self._error is not None and exc[0] is None:
            raise ServiceDied(f"the run's scheduler stopped: {type(self._error).__name__}: {self._error}") from self._error

    def abort(self, wait_s: float = 3.0) -> None:
        """Stop at once (the process is being interrupted): no checkpoint round, the ranks told to
        stop, the cluster shut down. Jobs resume from their last periodic checkpoint."""
        self.service.stop()
        executor = self.service.executor
        for job in list(executor.jobs.values()) if executor is not None else []:
            try:
                job.stop()
            except Exception:  # noqa: BLE001 - shutting down; the cluster goes next anyway
                continue
        if self._thread is not None:
            self._thread.join(wait_s)
        self.client.shutdown()

    def submit_at_arrivals(self, specs: Sequence[JobSpec], key_prefix: str) -> dict[str, str]:
        """Submit each job at its ``arrival_time`` (seconds from now), under its own id (this store is
        the run's alone, and a jobs file's ids are unique): the loop's results name the jobs as
        the file does. Job id -> store id (the same)."""
        t0 = time.monotonic()
        ids: dict[str, str] = {}
        for spec in sorted(specs, key=lambda s: (s.arrival_time, s.id)):
            while (delay := t0 + spec.arrival_time - time.monotonic()) > 0:
                self._tick()
                time.sleep(min(delay, 0.1))
            ids[spec.id] = self.jobs.submit_specs([spec], key_prefix=key_prefix, keep_ids=True)[0].job_id
        return ids

    def wait(self, job_ids: Sequence[str], poll_s: float = 0.2, timeout_s: float | None = None) -> list[JobRow]:
        """Until every job is terminal; TimeoutError naming the rest after ``timeout_s``."""
        return wait_until_done(lambda: self.jobs.jobs(ids=job_ids), timeout_s, poll_s, tick=self._tick)

    def _tick(self) -> None:
        self._check()
        self._pump()

    def _pump(self) -> None:
        while True:
            try:
                report = self._reports.get_nowait()
            except queue.Empty:
                return
            if self.observer is not None:
                self.observer(report)

    def _check(self) -> None:
        if self._error is not None or (self._thread is not None and not self._thread.is_alive()):
            raise ServiceDied(f"the run's scheduler stopped: {type(self._error).__name__}: {self._error}" if self._error else "the run's scheduler stopped")

    @property
    def result(self) -> LoopResult | None:
        return self.service.result

    def job_results(self) -> dict[str, JobResult]:
        return dict(self.service.executor.results) if self.service.executor is not None else {}
