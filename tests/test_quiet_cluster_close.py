"""A cluster closed while a task long-polls a Dask Event prints nothing (deploy/local.py).

`malleable train` printed `distributed.event - ERROR` and a traceback after every job: a rank's
plan watcher was still in its 2 s server-side wait when the CLI closed the cluster, and the
scheduler (in the CLI's process) logged the cancelled wait. Other errors of the logger stay."""

from __future__ import annotations

import asyncio
import logging
import time

from distributed import Client, Event

from deploy.local import local_gpu_cluster


def _wait_long(name: str) -> bool:
    return Event(name).wait(timeout=60)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_closing_a_cluster_under_a_pending_event_wait_logs_no_error() -> None:
    events_log, seen = logging.getLogger("distributed.event"), _Records()
    events_log.addHandler(seen)
    try:
        with local_gpu_cluster(1) as cluster, Client(cluster) as client:
            client.submit(_wait_long, "malleable-test-pending", pure=False)
            waiting = lambda: client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.extensions["events"]._waiter_count.get("malleable-test-pending", 0))  # noqa: E731
            deadline = time.monotonic() + 60
            while not waiting() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert waiting() == 1  # the wait is pending on the scheduler when the cluster closes
        # The scheduler's close cancelled it: without the filter, an ERROR record with the traceback.
        assert [r for r in seen.records if r.levelno >= logging.ERROR] == []
        # A real error of the same logger still gets through.
        try:
            raise RuntimeError("a real failure")
        except RuntimeError:
            events_log.exception("kept")
        try:
            raise asyncio.CancelledError
        except asyncio.CancelledError:
            events_log.exception("dropped")
        assert [r.getMessage() for r in seen.records if r.levelno >= logging.ERROR] == ["kept"]
    finally:
        events_log.removeHandler(seen)
