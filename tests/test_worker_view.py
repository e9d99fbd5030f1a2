"""The GPU workers a coordinator sees must be the workers that are up, every time it asks.

``Client.scheduler_info`` returns a cache that the client's own periodic refresh (every
``distributed.client.scheduler-info-interval``) overwrites with a copy that has *no* workers;
read between the two, every worker looks gone, and a coordinator then declares every rank of
a healthy job dead and restarts it from its checkpoint (seen in sim_vs_real_bench on a quiet
machine: two single-rank jobs "lost every rank" while their worker processes lived on).
"""

from __future__ import annotations

import dask
from distributed import Client, LocalCluster

from elastic_tasks.cluster import gpu_workers


def test_gpu_workers_never_misses_a_live_worker_while_the_client_refreshes_its_cache():
    # The refresh runs every millisecond here (default 2 s) so the race shows within a second.
    with dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}):
        with (
            LocalCluster(n_workers=2, processes=False, threads_per_worker=1, resources={"GPU": 1}, dashboard_address=None) as cluster,
            Client(cluster) as client,
        ):
            client.wait_for_workers(2, timeout=30)
            expected = sorted(cluster.scheduler.workers)
            seen = [gpu_workers(client) for _ in range(400)]
    short = sum(1 for s in seen if s != expected)
    assert short == 0, f"{short} of {len(seen)} reads missed a live worker"
