"""Seed-002/004 policies through the shared loop and simulator, beside elastic_dp, on CPU.

Two workloads, several seeds each, queueing mode:

* ``seed000``: seed 000's categories, bursty arrivals (1 h / 1 h) for 240 min on 40 GPUs.
* ``elan``: the same jobs, but every elastic job gets a min_res drawn from {1, 2, 4, 8}
  (seed 002's jobs carry min_res / max_res; seed 000's all start at 1 GPU, so a queue head
  is never blocked and backfilling cannot matter there), on 24 GPUs.

Also times one ``allocate`` call per policy for 100 queued jobs on 400 GPUs.
``admission_hook_active`` says whether ``allocator.admission`` consults a policy's own
``admit`` (E-FIFO vs E-BF differ only in admission; without the hook both use the generic
min-GPU test). The last printed line is one JSON object.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from allocator.admission import OverflowMode, admit
from allocator.loop import LoopSettings
from allocator.metrics import summarise
from allocator.policies import make_policy
from allocator.simulator import simulate
from allocator.types import ClusterSnapshot, JobSpec, RunningJob, Share, ThroughputProfile
from allocator.workloads.arrivals import ArrivalSpec, generate_jobs
from allocator.workloads.seed000 import load_category_profiles

PROFILES = load_category_profiles(Path(__file__).resolve().parents[1] / "examples" / "profiles")
POLICIES: dict[str, tuple[str, dict[str, object]]] = {
    "elastic_dp": ("elastic_dp", {}),
    "elan_fifo": ("elan_fifo", {}),
    "elan_backfill": ("elan_backfill", {}),
    "elan_fifo_jct": ("elan_fifo", {"jct_rule": True}),
    "elan_backfill_jct": ("elan_backfill", {"jct_rule": True}),
    "efficiency_threshold_0.1": ("efficiency_threshold", {"threshold": 0.1}),
    "efficiency_threshold_0.5": ("efficiency_threshold", {"threshold": 0.5}),
}
SEEDS = range(5)


def policy(label: str):
    name, params = POLICIES[label]
    return make_policy(name, **params)


def elan_jobs(seed: int, scale: float) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    out = []
    for job in generate_jobs(ArrivalSpec("bursty", 240, period_min=60, scale=scale), dict(PROFILES), rng):
        if job.elastic:
            m = int(rng.choice([1, 2, 4, 8]))
            job = dataclasses.replace(
                job, min_gpus=m, requested_gpus=m, max_gpus=max(job.max_gpus, 2 * m),
                min_batch=max(job.min_batch, m), max_batch=max(job.max_batch, 16 * m),
            )
        out.append(job)
    return out


def seed000_jobs(seed: int, scale: float) -> list[JobSpec]:
    return list(generate_jobs(ArrivalSpec("bursty", 240, period_min=60, scale=scale), dict(PROFILES), np.random.default_rng(seed)))


def run(workload, capacity: int, scale: float) -> dict[str, dict[str, float]]:
    settings = LoopSettings(interval_s=300, overflow=OverflowMode.QUEUE, react_to_events=True)
    out = {}
    for label in POLICIES:
        rows = []
        for seed in SEEDS:
            jobs = workload(seed, scale)
            m = summarise(simulate(jobs, policy(label), capacity, settings), {j.id: j for j in jobs})
            rows.append((m.jobs_completed, (m.avg_jct_s or 0) / 60, (m.p95_jct_s or 0) / 60, (m.avg_queue_delay_s or 0) / 60, m.makespan_s / 60, m.rescales))
        a = np.mean(rows, axis=0)
        out[label] = dict(zip(("completed", "avg_jct_min", "p95_jct_min", "queue_delay_min", "makespan_min", "rescales"), (round(float(x), 2) for x in a)))
        print(f"  {label:26s} " + "  ".join(f"{k}={v}" for k, v in out[label].items()))
    return out


def hook_active() -> bool:
    """Does the loop's admission use E-BF's own rule? Probe with a head blocked behind a running job."""
    p = ThroughputProfile("probe", 1_000_000, (1, 32), (0.005, 0.02), max_batch_per_gpu=32)

    def job(i: str, lo: int, hi: int, gpus: int, samples: int) -> JobSpec:
        return JobSpec(i, "probe", samples, lo, hi, gpus, p, min_gpus=gpus)

    r, h, s = job("r", 192, 192, 6, 50_000_000), job("h", 256, 256, 8, 100_000), job("s", 32, 64, 3, 10_000)
    snap = ClusterSnapshot(time=0.0, capacity=10, running=(RunningJob(r, Share(6, 192)),), queued=(h, s))
    return [j.id for j in admit(snap, make_policy("elan_backfill"), OverflowMode.QUEUE).admitted] == ["s"]


def allocate_us(label: str) -> float:
    jobs = elan_jobs(0, 40.0)[:100]
    snap = ClusterSnapshot(time=0.0, capacity=400, queued=tuple(jobs))
    p = policy(label)
    p.allocate(snap)
    n, t0 = 20, time.perf_counter()
    for _ in range(n):
        p.allocate(snap)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    t0 = time.perf_counter()
    print("seed000 bursty, 40 GPUs:")
    s000 = run(seed000_jobs, 40, 4.0)
    print("elan-style min_res, 24 GPUs:")
    elan = run(elan_jobs, 24, 5.0)
    timing = {label: round(allocate_us(label), 1) for label in POLICIES}
    print("allocate() for 100 jobs on 400 GPUs, microseconds:", timing)
    fifo, bf = elan["elan_fifo"], elan["elan_backfill"]
    print(json.dumps({
        "admission_hook_active": hook_active(),
        "elan_bf_over_fifo_avg_jct": round(bf["avg_jct_min"] / fifo["avg_jct_min"], 3),
        "elan_bf_over_fifo_queue_delay": round(bf["queue_delay_min"] / fifo["queue_delay_min"], 3),
        "elan_fifo_jct_rule_over_plain_avg_jct": round(elan["elan_fifo_jct"]["avg_jct_min"] / fifo["avg_jct_min"], 3),
        "elan_fifo_over_elastic_dp_avg_jct_seed000": round(s000["elan_fifo"]["avg_jct_min"] / s000["elastic_dp"]["avg_jct_min"], 3),
        "efficiency_0.5_over_0.1_rescales_seed000": round(s000["efficiency_threshold_0.5"]["rescales"] / max(1.0, s000["efficiency_threshold_0.1"]["rescales"]), 3),
        "elan_avg_jct_min": {k: v["avg_jct_min"] for k, v in elan.items()},
        "seed000_avg_jct_min": {k: v["avg_jct_min"] for k, v in s000.items()},
        "allocate_us_100jobs_400gpus": timing,
        "wall_s": round(time.perf_counter() - t0, 2),
    }))


if __name__ == "__main__":
    main()
