"""Real CPU cluster: time for 3 jobs to reach a target training loss, goodput_dp vs elastic_dp.

Three ``resnet_small`` jobs (global batch allowed in [32, 256], base batch 32) arrive a few
seconds apart on a LocalCluster of 3 workers; the shared loop (``allocator.loop.run_loop``)
drives them with the Dask executor, re-deciding on every arrival/completion and every
``--interval`` s. Both policies see the same jobs file and the same profile (measured here
first, in-process, one torch thread). ``goodput_dp`` knows the measured noise-scale
trajectory of resnet_small (``benchmarks/data/noise_trajectories.json``).

A job's time to target: its start in the loop's clock plus the summed step times
(``StepRecord.wall_s``) up to the first step whose loss, averaged over the last 10 steps,
is <= ``--target`` (rescale pauses are inside the step times of the steps around them).
Jobs run all their samples either way; a job that never reaches the target counts its
JCT and is flagged.

Run: python benchmarks/goodput_real_bench.py [--target 1.2] [--samples 49152]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from distributed import Client

from allocator.admission import OverflowMode
from allocator.loop import LoopSettings, run_loop
from allocator.policies import make_policy
from allocator.types import JobSpec
from benchmarks.goodput_bench import TRAJECTORIES, load_trajectories
from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import warm_up
from elastic_tasks.examples.recipes import resnet_small
from elastic_tasks.executor import DaskExecutor, JobSettings
from elastic_tasks.profiling.settings import ProfileSettings
from elastic_tasks.profiling.profiler import profile_recipe

ENTRY = "elastic_tasks.examples.recipes:resnet_small"
WORKERS = 3


def time_to_target(result, record, target: float, window: int = 10) -> tuple[float, bool]:
    losses = np.array([h.loss for h in result.history])
    walls = np.cumsum([h.wall_s for h in result.history])
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    hit = np.flatnonzero(smooth <= target)
    if hit.size == 0:
        return record.finish - record.arrival, False
    step = int(hit[0]) + window - 1
    return record.start - record.arrival + float(walls[step]), True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=float, default=1.2)
    ap.add_argument("--samples", type=int, default=49_152)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--arrivals", type=float, nargs=3, default=[0.0, 5.0, 10.0])
    ap.add_argument("--first", choices=["elastic_dp", "goodput_dp"], default="elastic_dp", help="which policy runs first (load drifts)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    report = profile_recipe(resnet_small(), ProfileSettings(batch_sizes=(16, 32, 64, 128, 256), threads=1, max_batch_per_gpu=256))
    profile = report.profile
    print("profile s per batch:", dict(zip(profile.batch_sizes, (round(t, 4) for t in profile.iter_times_s))), flush=True)
    jobs = [
        JobSpec(id=f"job-{c}", workload="resnet50-cifar100", total_samples=args.samples, min_batch=32, max_batch=256,
                max_gpus=WORKERS, profile=profile, arrival_time=a)
        for c, a in zip("abc", args.arrivals)
    ]
    noise = load_trajectories(TRAJECTORIES)
    settings = LoopSettings(interval_s=args.interval, overflow=OverflowMode.QUEUE, react_to_events=True)
    figures: dict[str, object] = {"target_loss": args.target, "samples_per_job": args.samples}
    with local_gpu_cluster(WORKERS) as cluster, Client(cluster) as client:
        warm_up(client, ENTRY)
        runs = [("elastic_dp", make_policy("elastic_dp")), ("goodput_dp", make_policy("goodput_dp", noise=noise, p=-1.0))]
        for name, policy in runs if args.first == "elastic_dp" else runs[::-1]:
            executor = DaskExecutor(client, {"resnet50-cifar100": ENTRY}, JobSettings(timeout_s=60.0, poll_s=0.25))
            loop = run_loop(jobs, policy, WORKERS, executor.clock, executor, settings)
            executor.close()
            ttt, jct, reached = [], [], []
            for job in jobs:
                rec = loop.record(job.id)
                t, ok = time_to_target(executor.results[job.id], rec, args.target)
                ttt.append(t)
                jct.append(rec.finish - rec.arrival)
                reached.append(ok)
                batches = sorted({h.global_batch for h in executor.results[job.id].history})
                print(f"{name:11s} {job.id}: time to loss {args.target}: {t:6.1f} s ({'reached' if ok else 'NOT reached'})"
                      f"  JCT {jct[-1]:6.1f} s  batches {batches}  final loss {executor.results[job.id].final_loss:.3f}", flush=True)
            figures[f"{name}_mean_time_to_target_s"] = round(float(np.mean(ttt)), 1)
            figures[f"{name}_mean_jct_s"] = round(float(np.mean(jct)), 1)
            figures[f"{name}_all_reached"] = all(reached)
    figures["real_time_to_target_goodput_over_elastic_dp"] = round(
        figures["goodput_dp_mean_time_to_target_s"] / figures["elastic_dp_mean_time_to_target_s"], 3)
    figures["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
