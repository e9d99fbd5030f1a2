"""The trainer records the gradient noise scale in its step records (real Dask workers, gloo, tiny MLP)."""

import math
import time

import pytest
from distributed import Client

from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import WorkerPool, warm_up
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.protocol import TrainConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"


def test_noise_scale_is_estimated_on_two_ranks_and_on_one_rank_with_accumulation():
    with local_gpu_cluster(2) as cluster, Client(cluster) as client:
        warm_up(client, ENTRY)
        # 2 ranks: local vs global gradient; then 1 rank with a cap of 10: micro-batches vs the step.
        config = TrainConfig(global_batch=40, max_steps=30, timeout_s=20.0, max_batch_per_gpu=10)
        job = JobCoordinator(client, WorkerPool(client), f"gns-{time.monotonic_ns()}", ENTRY, config, delays={0: 0.02, 1: 0.02})
        job.start(2)
        job.rescale(1, at_step=15)
        result = job.wait(120)
    by_step = {h.step: h for h in result.history}
    two, one = [by_step[s] for s in range(2, 15)], [by_step[s] for s in range(16, 30)]
    assert all(h.world_size == 2 for h in two) and all(h.world_size == 1 for h in one)
    assert all(h.noise_scale is not None for h in two + one)
    # A few steps in, the smoothed |G|^2 is positive: the estimate is finite (earlier it may read inf).
    settled = [by_step[s].noise_scale for s in (*range(10, 15), *range(25, 30))]
    assert all(0 < v < math.inf for v in settled), settled
