"""Seed-000 DP allocator speed: vectorised numpy vs plain-Python loops, same instances, same run.

Instances: random jobs with profiles t(b) = overhead + b / rate, each job's max GPUs = kmax.
Figures:
  dp_100x400_ms         median solve of the vectorised DP, 100 jobs x 400 GPUs, kmax 16 (>= 20 runs)
  dp_1000x10000_ms      median solve, 1000 jobs x 10000 GPUs, kmax 16
  policy_100x400_ms     elastic_dp.allocate end to end (value matrix + solve + shares), warm profile cache
  python_dp_100x400_ms  the same 100x400 program as three Python loops (seed 000's Algorithm 1)
  speedup_vs_python_dp  python_dp_100x400_ms / dp_100x400_ms

Run: python benchmarks/allocator_bench.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from allocator.policies import make_policy
from allocator.policies.dp import solve_dp, solve_dp_python
from allocator.policies.elastic_dp import job_table
from allocator.throughput import baseline_rate
from allocator.types import AllreduceModel, ClusterSnapshot, JobSpec, ThroughputProfile


def random_jobs(n: int, kmax: int, rng: np.random.Generator) -> list[JobSpec]:
    jobs = []
    for i in range(n):
        overhead, rate = rng.uniform(0.002, 0.02), rng.uniform(500, 20_000)
        sizes = (8, 16, 32, 64, 128, 256)
        profile = ThroughputProfile(
            workload=f"w{i}",
            num_params=int(rng.integers(5_000_000, 150_000_000)),
            batch_sizes=sizes,
            iter_times_s=tuple(overhead + b / rate for b in sizes),
            max_batch_per_gpu=256,
            allreduce=AllreduceModel(latency_s=float(rng.uniform(0, 1e-4)), seconds_per_param=float(rng.uniform(0, 2e-10))),
        )
        lo = int(rng.choice([16, 32, 64]))
        jobs.append(JobSpec(f"j{i}", f"w{i}", 1_000_000, lo, int(rng.choice([256, 512, 1024, 2048])), kmax, profile))
    return jobs


def value_matrix(jobs: list[JobSpec], kmax: int) -> np.ndarray:
    return np.array([job_table(j, kmax, None).rates / baseline_rate(j) for j in jobs])


def median_ms(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    small_jobs = random_jobs(100, 16, rng)
    small = value_matrix(small_jobs, 16)
    large = value_matrix(random_jobs(1000, 16, rng), 16)

    counts, opt = solve_dp(small, 400)
    counts_py, opt_py = solve_dp_python(small.tolist(), 400)
    assert list(counts) == counts_py and abs(opt - opt_py) < 1e-9, "vectorised and plain DP disagree"

    dp_small = median_ms(lambda: solve_dp(small, 400), args.repeats)
    dp_large = median_ms(lambda: solve_dp(large, 10_000), max(5, args.repeats // 4))
    python_small = median_ms(lambda: solve_dp_python(small.tolist(), 400), 3)
    policy = make_policy("elastic_dp")
    snap = ClusterSnapshot(0.0, 400, queued=tuple(small_jobs))
    policy.allocate(snap)  # warm the rate-table cache, as a running autoscaler has it
    policy_small = median_ms(lambda: policy.allocate(snap), args.repeats)

    print(f"{'instance':<28}{'vectorised ms':>15}{'python ms':>12}{'speedup':>10}")
    print(f"{'100 jobs x 400 GPUs':<28}{dp_small:>15.2f}{python_small:>12.1f}{python_small / dp_small:>9.0f}x")
    print(f"{'1000 jobs x 10000 GPUs':<28}{dp_large:>15.1f}{'-':>12}{'-':>10}")
    print(f"{'elastic_dp.allocate 100x400':<28}{policy_small:>15.2f}")
    print(
        json.dumps(
            {
                "dp_100x400_ms": round(dp_small, 3),
                "dp_1000x10000_ms": round(dp_large, 1),
                "policy_100x400_ms": round(policy_small, 3),
                "python_dp_100x400_ms": round(python_small, 1),
                "speedup_vs_python_dp": round(python_small / dp_small, 1),
                "same_optimum": True,
            }
        )
    )


if __name__ == "__main__":
    main()
