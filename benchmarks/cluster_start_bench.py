"""Starting the CLI's local cluster (what `malleable serve`, `run`, `retrain` and `hpo run` start on CPU):
every nanny in one `dask spec` process whose workers fork from one preloaded fork server
(`deploy.local.local_cluster`) vs distributed's `SubprocessCluster` layout (one `dask spec`
process per worker, each spawning a worker that imports torch afresh; what it used before),
side by side in one run, alternating.

A start is counted from the call to the end of `warm_up_trainer` (every worker and the
scheduler have imported the trainer: the service's first job may start). CPU is that of this
process's whole tree (every live descendant and what each reaped), read before the close.

Figures:
  grouped_start_s / spawned_start_s     median wall seconds of a start, each layout
  grouped_start_cpu_s / spawned_start_cpu_s  median CPU seconds of the tree over a start
  cpu_ratio                             spawned_start_cpu_s / grouped_start_cpu_s
  wall_ratio                            spawned_start_s / grouped_start_s

Run: python benchmarks/cluster_start_bench.py [--workers 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed import Client  # noqa: E402
from distributed.deploy.subprocess import SubprocessCluster  # noqa: E402

from deploy import local  # noqa: E402
from elastic_tasks.cluster import warm_up_trainer  # noqa: E402
from elastic_tasks.devices import GPU_RESOURCE  # noqa: E402
from tests.timing import tree_cpu_s  # noqa: E402 - the suite's own measure of a process tree's CPU


def spawned(workers: int):  # noqa: ANN201 - a SpecCluster
    """The layout before: distributed's SubprocessCluster, started as ``local_cluster`` starts its own."""
    with local.subprocess_cluster_start():
        return SubprocessCluster(
            n_workers=workers, threads_per_worker=1, worker_kwargs={"resources": {GPU_RESOURCE: 1}, "memory_limit": 0}, dashboard_address=None
        )


def one_start(make: Callable[[int], object], workers: int) -> tuple[float, float]:
    before = tree_cpu_s()
    t0 = time.perf_counter()
    with make(workers) as cluster, Client(cluster) as client:  # type: ignore[attr-defined]
        client.wait_for_workers(workers, timeout=180)
        warm_up_trainer(client)
        wall = time.perf_counter() - t0
        cpu = tree_cpu_s() - before
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("distributed").setLevel(logging.ERROR)
    layouts = {"grouped": lambda n: local.local_cluster(n, visible=[]), "spawned": spawned}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in layouts}
    for i in range(args.repeats):
        for name, make in layouts.items() if i % 2 == 0 else reversed(layouts.items()):
            wall, cpu = one_start(make, args.workers)
            runs[name].append((wall, cpu))
            print(f"run {i + 1} {name:8s} start {wall:6.1f} s  cpu {cpu:6.1f} s", flush=True)
    out: dict[str, object] = {"workers": args.workers, "repeats": args.repeats, "load_avg_1m": round(os.getloadavg()[0], 2)}
    for name, values in runs.items():
        out[f"{name}_start_s"] = round(statistics.median(w for w, _ in values), 2)
        out[f"{name}_start_cpu_s"] = round(statistics.median(c for _, c in values), 2)
    out["cpu_ratio"] = round(out["spawned_start_cpu_s"] / out["grouped_start_cpu_s"], 2)  # type: ignore[operator]
    out["wall_ratio"] = round(out["spawned_start_s"] / out["grouped_start_s"], 2)  # type: ignore[operator]
    print(f"spawned/grouped: CPU x{out['cpu_ratio']}, wall x{out['wall_ratio']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
