"""A rank lost on a real cluster: the service's allocation history gets a row for the shrink
(real Dask workers, gloo, the tiny MLP, the service's recorder on a real store; marked slow).

The coordinator shrinks the job in place by itself; the loop, asking the executor what runs,
reports the shrink, and the recorder writes it like any change of share."""

import os
import signal
import threading
import time

import pytest
from distributed import Client

from allocator.loop import LoopSettings, run_loop
from allocator.loop.sources import Arrivals
from allocator.policies import make_policy
from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import gpu_workers, warm_up
from elastic_tasks.executor import DaskExecutor, JobSettings, WallClock
from service.client import ServiceClient
from service.recorder import StoreRecorder
from service.store import JobStore
from service.tracking import ServiceTracking
from tests.factories import make_job, make_profile
from tests.service_helpers import job_entry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"


class OneJobFeed:
    """Hands over ``job`` at once, then nothing until ``stop`` is set."""

    def __init__(self, job, stop: threading.Event) -> None:
        self.job, self.stop = job, stop

    def poll(self, now):
        job, self.job = self.job, None
        return Arrivals(jobs=(job,) if job is not None else (), stop=self.stop.is_set())

    def next_arrival(self, now):
        return now + 0.2


def test_a_killed_ranks_in_place_shrink_is_a_row_in_the_service_store(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    job_id = ServiceClient(store).submit(job_entry("a", 50_000_000, min_batch=64, max_batch=64, min_gpus=1, max_gpus=2)).job_id
    profile = make_profile("mlp", num_params=6_500, cap=128)
    job = make_job(job_id, profile, workload="mlp", total_samples=50_000_000, min_batch=64, max_batch=64, min_gpus=1, max_gpus=2)
    tracking = ServiceTracking(None, "exp", warn=lambda _line: None)
    stop = threading.Event()
    with local_gpu_cluster(2) as cluster, Client(cluster) as client:
        warm_up(client, ENTRY)
        executor = DaskExecutor(client, {"mlp": ENTRY}, JobSettings(timeout_s=10.0, poll_s=0.2))
        recorder = StoreRecorder(store, tracking, lambda j: str(tmp_path / "ckpt" / j), lambda _j: None, say=lambda _line: None)
        loop = threading.Thread(
            target=run_loop,
            args=(OneJobFeed(job, stop), make_policy("elastic_dp"), lambda: len(gpu_workers(client)), WallClock(), executor, LoopSettings(interval_s=100.0)),
            kwargs={"observer": recorder.observer, "on_job": recorder.on_job},
            daemon=True,
        )
        loop.start()
        try:
            deadline = time.monotonic() + 120
            while not ((c := executor.jobs.get(job_id)) is not None and c.world_size == 2 and (s := c.status()) is not None and s.step >= 5):
                assert time.monotonic() < deadline, f"no training on 2 ranks: {[(a.kind, a.gpus) for a in store.allocations(job_id)]}"
                time.sleep(0.2)
            coordinator = executor.jobs[job_id]
            victim = coordinator.worker_of[sorted(coordinator.worker_of)[-1]]  # not rank 0's worker: the rendezvous stays
            os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
            deadline = time.monotonic() + 120
            while ("in_place", 1) not in (rows := [(a.kind, a.gpus) for a in store.allocations(job_id)]):
                assert time.monotonic() < deadline, f"no row for the shrink: {rows}; recoveries {coordinator.recoveries}"
                time.sleep(0.2)
            assert rows[:2] == [("start", 2), ("in_place", 1)]
            assert len(coordinator.recoveries) == 1 and len(coordinator.recoveries[0].survivors) == 1
            assert store.job(job_id).gpus in (1, 2)  # 2 once the nanny's restarted worker is taken back
        finally:
            stop.set()
            loop.join(timeout=120)
            executor.suspend_all(timeout=30)
            executor.close()
            tracking.close()
