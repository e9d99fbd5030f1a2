"""The scheduler service for real: `malleable serve` processes on a real Dask cluster with gloo
training, a sqlite job store, MLflow; the capacity follows the Dask workers alive: a worker joining a running cluster grows a running job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from service.client import ServiceClient
from service.store import JobStore
from service.store.records import JobState
from tests.service_process import entry, service_env, wait_until  # noqa: F401 - service_env is a fixture

pytestmark = pytest.mark.slow


def test_capacity_follows_the_workers_alive_a_joining_worker_grows_a_running_job(service_env, tmp_path):
    start, store_url, env, cwd = service_env
    procs: list[subprocess.Popen] = []

    def spawn(*args: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-m", "dask", *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        return p

    scheduler_file = tmp_path / "scheduler.json"
    try:
        spawn("scheduler", "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1", "--no-dashboard")
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        worker = ("worker", address, "--nthreads", "1", "--resources", "GPU=1", "--no-dashboard", "--memory-limit", "0")
        spawn(*worker)
        env.update(MALLEABLE_CLUSTER="address", MALLEABLE_SCHEDULER_ADDRESS=address)
        svc = start()
        svc.wait_for_line("serving")
        store = JobStore(store_url)
        job = ServiceClient(store).submit(entry("grows", 3_000_000)).job_id
        wait_until(lambda: [(a.kind, a.gpus) for a in store.allocations(job)] == [("start", 1)], 90, "a start on the one worker", store)
        spawn(*worker)  # a second GPU worker joins the running cluster
        wait_until(lambda: ("in_place", 2) in [(a.kind, a.gpus) for a in store.allocations(job)], 120, "the job growing onto the new worker", store)
        store.request_cancel(job)
        wait_until(lambda: store.job(job).state is JobState.CANCELLED, 60, "cancelled", store)
        assert svc.stop() == 0
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
