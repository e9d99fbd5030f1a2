"""Why goodput_dp's mean JCT is what it is on goodput_bench's workload: measurements, not a benchmark.

Same workload, physics and settings as ``benchmarks/goodput_bench.py``. Prints, per policy:
mean JCT split into queueing (arrival -> start) and running (start -> finish); the share of
time a queue exists and the GPUs idle meanwhile (at the Δ ticks and between them); the GPU
time held against the least any allocation could use (every piece of a job's noise
trajectory at the best goodput per GPU); and how much slower each running stretch is at the
batch chosen at the tick than at the batch best for each noise piece it crosses (on the same
GPUs). Then what-ifs that change one thing for both policies alike: Δ = 60 s, re-deciding on
every arrival/completion, and shortest-job-first admission (shortest single-GPU run time first).

Run: python benchmarks/goodput_diagnose.py [--seeds 0 1 2] [--what-ifs]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from allocator.admission import OverflowMode, admit_in_order
from allocator.physics.goodput import goodput_rows, goodput_table
from allocator.loop import LoopResult, LoopSettings
from allocator.metrics import gpu_seconds_by_job, summarise
from allocator.policies import make_policy
from allocator.policies.elastic_dp import ElasticDP
from allocator.policies.goodput_dp import GoodputDP
from allocator.protocols import AdmissionDecision
from allocator.simulator.experiments import SEED000_INTERVAL_S
from allocator.simulator.goodput_executor import GoodputSimExecutor, simulate_goodput
from allocator.physics.throughput import baseline_rate
from allocator.types import ClusterSnapshot, JobSpec, Share
from allocator.workloads.arrivals import ArrivalSpec, Pattern, generate_jobs
from allocator.workloads.seed000 import load_category_profiles
from benchmarks.goodput_bench import CAPACITY, PROFILES, TRAJECTORIES, load_trajectories

GRID_S = 5.0


def _shortest_first(snapshot: ClusterSnapshot, size) -> ClusterSnapshot:
    return replace(snapshot, queued=tuple(sorted(snapshot.queued, key=size)))


class ShortestFirstGoodput(GoodputDP):
    """goodput_dp admitting the queue shortest first (single-GPU time at the goodput-best batch)."""

    def admit(self, snapshot: ClusterSnapshot, mode: OverflowMode) -> AdmissionDecision:
        def size(job: JobSpec) -> float:
            return job.total_samples / float(goodput_rows(job, 1, self.noise_scale(job, 0.0)).goodput[1])

        return admit_in_order(_shortest_first(snapshot, size), self, mode, strict_fifo=False)


class ShortestFirstElastic(ElasticDP):
    """elastic_dp admitting the queue shortest first (seed 000's single-GPU job length)."""

    def admit(self, snapshot: ClusterSnapshot, mode: OverflowMode) -> AdmissionDecision:
        return admit_in_order(_shortest_first(snapshot, lambda j: j.total_samples / baseline_rate(j)), self, mode, strict_fifo=False)


def queue_and_idle(result: LoopResult, interval_s: float) -> tuple[float, float, float]:
    """(share of time with a queue, mean idle GPUs then, mean idle GPUs at the ticks then)."""
    grid = np.arange(0.0, result.end_time, GRID_S)
    queued = np.zeros(len(grid))
    for job in result.jobs:
        queued += (grid >= job.arrival) & (grid < job.start)
    times = np.array([t for t, _ in result.gpu_usage])
    gpus = np.array([g for _, g in result.gpu_usage])
    idle = result.capacity - gpus[np.searchsorted(times, grid, side="right") - 1]
    waiting = queued > 0
    at_tick = waiting & (grid % interval_s < GRID_S)
    return float(waiting.mean()), float(idle[waiting].mean()), float(idle[at_tick].mean())


def least_gpu_seconds(spec: JobSpec, executor: GoodputSimExecutor) -> float:
    """GPU-seconds of a job run at the best goodput per GPU in every noise piece (any feasible k)."""
    trajectory, total = executor.trajectory(spec), 0.0
    for (lo, hi), noise in zip(zip(trajectory.bounds, trajectory.bounds[1:]), trajectory.values):
        table = goodput_table(spec, min(spec.max_gpus, CAPACITY), noise)
        per_gpu = table.goodput[1:] / np.arange(1, len(table.goodput))
        total += (hi - lo) * spec.total_samples / float(np.max(np.where(np.isfinite(per_gpu), per_gpu, 0.0)))
    return total


def batch_staleness(result: LoopResult, specs: dict[str, JobSpec], executor: GoodputSimExecutor) -> float:
    """Seconds run at the chosen batches / seconds the same work takes at each noise piece's best batch."""
    finish = {j.job_id: j.finish for j in result.jobs}
    rows: dict[str, list] = {}
    for row in result.schedule:
        rows.setdefault(row.job_id, []).append(row)
    spent = best = 0.0
    for job_id, stretch in rows.items():
        spec = specs[job_id]
        trajectory = executor.trajectory(spec)
        ends = np.array(trajectory.bounds) * spec.total_samples
        done = 0.0
        for row, following in zip(stretch, stretch[1:] + [None]):
            if row.gpus == 0:
                continue
            left = (following.time if following is not None else finish[job_id]) - row.time
            rates = executor.rates(spec, Share(row.gpus, row.batch, row.accum_steps))
            for i, rate in enumerate(rates):
                if ends[i + 1] <= done or left <= 0:
                    continue
                seconds = min((ends[i + 1] - done) / rate, left)
                optimum = goodput_table(spec, row.gpus, trajectory.values[i], limit_gpus=False).goodput[row.gpus]
                spent, best = spent + seconds, best + seconds * rate / optimum
                done, left = done + seconds * rate, left - seconds
    return spent / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=480.0)
    parser.add_argument("--what-ifs", action="store_true")
    args = parser.parse_args()
    noise = load_trajectories(TRAJECTORIES)
    profiles = load_category_profiles(PROFILES)
    arrivals = ArrivalSpec(Pattern.BURSTY, args.minutes, period_min=120, scale=CAPACITY / 10)
    settings = LoopSettings(interval_s=SEED000_INTERVAL_S, overflow=OverflowMode.QUEUE, react_to_events=False)
    executor = GoodputSimExecutor(noise)  # only for its trajectories and rates
    workloads = [generate_jobs(arrivals, profiles, np.random.default_rng(seed)) for seed in args.seeds]
    policies = {"goodput_dp": lambda: make_policy("goodput_dp", noise=noise, p=-1.0), "elastic_dp": lambda: make_policy("elastic_dp")}
    for name, make in policies.items():
        jct, queue, run, share, idle, tick_idle, held, least, stale = ([] for _ in range(9))
        for jobs in workloads:
            specs = {j.id: j for j in jobs}
            result = simulate_goodput(jobs, make(), CAPACITY, noise, settings)
            jct.append(summarise(result, specs).avg_jct_s)
            queue.append(np.mean([j.start - j.arrival for j in result.jobs]))
            run.append(np.mean([j.finish - j.start for j in result.jobs]))
            s, i, t = queue_and_idle(result, settings.interval_s)
            share.append(s), idle.append(i), tick_idle.append(t)
            held.append(sum(gpu_seconds_by_job(result).values()))
            least.append(sum(least_gpu_seconds(j, executor) for j in jobs))
            stale.append(batch_staleness(result, specs, executor))
        print(f"{name}: mean JCT {np.mean(jct) / 60:.1f} min = queue {np.mean(queue) / 60:.1f} + run {np.mean(run) / 60:.1f}; "
              f"queue exists {np.mean(share):.0%} of the time, {np.mean(idle):.1f} GPUs idle meanwhile ({np.mean(tick_idle):.1f} at ticks); "
              f"GPU time held / least possible {np.sum(held) / np.sum(least):.3f}; batch staleness {np.mean(stale):.4f}", flush=True)
    if not args.what_ifs:
        return
    variants = {
        "Δ = 60 s": (policies, replace(settings, interval_s=60.0)),
        "re-decide on events": (policies, replace(settings, react_to_events=True)),
        "shortest-job-first admission": (
            {"goodput_dp": lambda: ShortestFirstGoodput(noise=noise, p=-1.0), "elastic_dp": ShortestFirstElastic},
            settings,
        ),
    }
    for label, (makers, what) in variants.items():
        means = {}
        for name, make in makers.items():
            means[name] = np.mean([summarise(simulate_goodput(jobs, make(), CAPACITY, noise, what), {j.id: j for j in jobs}).avg_jct_s for jobs in workloads])
        print(f"what-if {label}: goodput_dp {means['goodput_dp'] / 60:.1f} min, elastic_dp {means['elastic_dp'] / 60:.1f} min, "
              f"ratio {means['goodput_dp'] / means['elastic_dp']:.3f}", flush=True)


if __name__ == "__main__":
    main()
