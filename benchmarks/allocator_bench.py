"""Seed-000 DP allocator speed: vectorised numpy vs plain-Python loops, same instances, same run.

Instances: random jobs with profiles t(b) = overhead + b / rate, each job's max GPUs = kmax.
Figures:
  dp_100x400_ms         median solve of the vectorised DP, 100 jobs x 400 GPUs, kmax 16 (>= 20 runs)
  dp_1000x10000_ms      median solve, 1000 jobs x 10000 GPUs, kmax 16
  policy_100x400_ms     elastic_dp.allocate end to end (value matrix + solve + shares), warm profile cache
  goodput_100x400_ms    goodput_dp.allocate on the same jobs, each with its own noise scale, warm caches
                        (the same snapshot again: a queue's jobs keep their noise scale)
  goodput_cold_100x400_ms  goodput_dp.allocate where every job is running and reports a new noise
                        scale at every decision (the real service): every goodput table recomputed
  goodput_over_elastic_100x400, goodput_cold_over_elastic_100x400: ratios per decision, the three
                        measured interleaved in one run (target <= 3)
  python_dp_100x400_ms  the same 100x400 program as three Python loops (seed 000's Algorithm 1)
  speedup_vs_python_dp  python_dp_100x400_ms / dp_100x400_ms
  brute_force_instances   random small instances (1-4 elastic jobs, <= 10 GPUs) where elastic_dp's
                          answer was compared with a brute force written here: its own T(b, k),
                          every batch in [min_batch, max_batch] and every GPU count enumerated
  brute_force_feasible    how many of those had a feasible allocation (the rest: both must say infeasible)
  brute_force_mismatches  instances where elastic_dp's objective (scored with the brute force's own
                          T) differs from the optimum by more than 1e-9 relative, its shares break a
                          limit, or it disagrees on feasibility

Run: python benchmarks/allocator_bench.py [--repeats 20] [--brute-force 300]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from dataclasses import dataclass, replace

import numpy as np

from allocator.physics.noise import NoiseTrajectory
from allocator.policies import make_policy
from allocator.policies.dp import solve_dp, solve_dp_python
from allocator.policies.elastic_dp import job_table
from allocator.physics.throughput import baseline_rate
from allocator.types import AllreduceModel, ClusterSnapshot, InfeasibleError, JobSpec, RunningJob, ThroughputProfile


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


@dataclass(frozen=True)
class LinearJob:
    """A job whose one-GPU iteration time is overhead + c / rate for 1 <= c <= cap samples per GPU."""

    spec: JobSpec
    overhead: float
    rate: float
    cap: int

    def speed(self, batch: int, gpus: int) -> float:
        """Seed 000's T(b, k) = b / (t_proc(ceil(b / k)) + ring allreduce), written out here."""
        per_gpu = -(-batch // gpus)
        if gpus < 1 or batch < gpus or per_gpu > self.cap:
            return 0.0
        ar, p = self.spec.profile.allreduce, self.spec.profile.num_params
        comm = 2 * (gpus - 1) * ar.latency_s + 2 * (gpus - 1) / gpus * p * ar.seconds_per_param
        return batch / (self.overhead + per_gpu / self.rate + comm)

    def value(self, gpus: int) -> float:
        """Best T(b, k) over every batch in range, over seed 000's normaliser T(min(cap, max_batch), 1)."""
        s = self.spec
        if not s.min_gpus <= gpus <= s.max_gpus:
            return -math.inf
        best = max((self.speed(b, gpus) for b in range(s.min_batch, s.max_batch + 1)), default=0.0)
        return best / self.speed(min(self.cap, s.max_batch), 1) if best > 0 else -math.inf


def small_instance(rng: np.random.Generator) -> tuple[list[LinearJob], int]:
    """1-4 elastic jobs; capacity drawn around the sum of their fewest runnable GPUs so most
    instances are feasible and some are tight."""
    jobs = []
    for i in range(int(rng.integers(1, 5))):
        overhead, rate, cap = float(rng.uniform(0.002, 0.02)), float(rng.uniform(500, 20_000)), int(rng.choice([4, 8, 16, 32]))
        sizes = tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= cap)
        profile = ThroughputProfile(
            f"w{i}", int(rng.integers(1_000_000, 100_000_000)), sizes, tuple(overhead + b / rate for b in sizes), cap,
            AllreduceModel(float(rng.uniform(0, 1e-3)), float(rng.uniform(0, 5e-9))),
        )
        top = int(rng.integers(1, 7))
        lo = int(rng.integers(1, min(64, cap * top) + 1))  # runnable on at most max_gpus GPUs
        spec = JobSpec(f"j{i}", f"w{i}", 10_000, lo, int(rng.integers(lo, 4 * lo + 1)), top, profile, min_gpus=min(top, int(rng.choice([1, 1, 1, 2]))))
        jobs.append(LinearJob(spec, overhead, rate, cap))
    fewest = [min((k for k in range(1, 11) if math.isfinite(j.value(k))), default=11) for j in jobs]
    return jobs, max(1, sum(fewest) + int(rng.integers(-1, 4)))


def brute_force_check(instances: int, seed: int = 1, policy_name: str = "elastic_dp") -> dict[str, int]:
    """Compare a policy (elastic_dp) with an enumeration of every GPU count (and, inside
    value(), every batch)."""
    rng = np.random.default_rng(seed)
    policy = make_policy(policy_name)
    feasible = mismatches = 0
    for _ in range(instances):
        jobs, capacity = small_instance(rng)
        tables = [[j.value(k) for k in range(capacity + 1)] for j in jobs]
        best = max(
            (sum(t[k] for t, k in zip(tables, counts)) for counts in itertools.product(range(1, capacity + 1), repeat=len(jobs)) if sum(counts) <= capacity),
            default=-math.inf,
        )
        feasible += math.isfinite(best)
        try:
            alloc = policy.allocate(ClusterSnapshot(0.0, capacity, queued=tuple(j.spec for j in jobs)))
        except InfeasibleError:
            mismatches += math.isfinite(best)
            continue
        shares = [alloc[j.spec.id] for j in jobs]
        legal = sum(s.gpus for s in shares) <= capacity and all(
            j.spec.min_gpus <= s.gpus <= j.spec.max_gpus and j.spec.min_batch <= s.global_batch <= j.spec.max_batch for j, s in zip(jobs, shares)
        )
        got = sum(j.speed(s.global_batch, s.gpus) / j.speed(min(j.cap, j.spec.max_batch), 1) for j, s in zip(jobs, shares))
        mismatches += not (legal and math.isfinite(best) and abs(got - best) <= 1e-9 * max(1.0, abs(best)))
    return {"brute_force_instances": instances, "brute_force_feasible": feasible, "brute_force_mismatches": mismatches}


def median_ms(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def goodput_vs_elastic(jobs: list[JobSpec], capacity: int, repeats: int, rng: np.random.Generator) -> dict[str, float]:
    """Per-decision time of elastic_dp and goodput_dp (warm and cold), interleaved in one loop."""
    noisy = [replace(j, noise_scale=NoiseTrajectory.constant(float(rng.uniform(50, 5000)))) for j in jobs]
    elastic, goodput = make_policy("elastic_dp"), make_policy("goodput_dp")
    queued = ClusterSnapshot(0.0, capacity, queued=tuple(noisy))
    elastic.allocate(queued), goodput.allocate(queued)  # warm caches, as a running autoscaler has them
    times: dict[str, list[float]] = {"elastic": [], "goodput": [], "cold": []}
    for _ in range(repeats):
        running = ClusterSnapshot(0.0, capacity, running=tuple(RunningJob(j, None, 1000.0, noise_scale=float(rng.uniform(50, 5000))) for j in noisy))
        for key, run in (("elastic", lambda: elastic.allocate(queued)), ("goodput", lambda: goodput.allocate(queued)), ("cold", lambda: goodput.allocate(running))):
            t0 = time.perf_counter()
            run()
            times[key].append((time.perf_counter() - t0) * 1000)
    e, g, c = (statistics.median(times[k]) for k in ("elastic", "goodput", "cold"))
    return {
        "goodput_100x400_ms": round(g, 3),
        "goodput_cold_100x400_ms": round(c, 3),
        "goodput_over_elastic_100x400": round(g / e, 2),
        "goodput_cold_over_elastic_100x400": round(c / e, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--brute-force", type=int, default=300, help="random small instances checked by enumeration (>= 200)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    small_jobs = random_jobs(100, 16, rng)
    small = value_matrix(small_jobs, 16)
    large = value_matrix(random_jobs(1000, 16, rng), 16)

    check = brute_force_check(args.brute_force)
    dp_small = median_ms(lambda: solve_dp(small, 400), args.repeats)
    dp_large = median_ms(lambda: solve_dp(large, 10_000), max(5, args.repeats // 4))
    python_small = median_ms(lambda: solve_dp_python(small.tolist(), 400), 3)
    policy = make_policy("elastic_dp")
    snap = ClusterSnapshot(0.0, 400, queued=tuple(small_jobs))
    policy.allocate(snap)  # warm the rate-table cache, as a running autoscaler has it
    policy_small = median_ms(lambda: policy.allocate(snap), args.repeats)
    goodput = goodput_vs_elastic(small_jobs, 400, args.repeats, rng)

    print(f"{'instance':<28}{'vectorised ms':>15}{'python ms':>12}{'speedup':>10}")
    print(f"{'100 jobs x 400 GPUs':<28}{dp_small:>15.2f}{python_small:>12.1f}{python_small / dp_small:>9.0f}x")
    print(f"{'1000 jobs x 10000 GPUs':<28}{dp_large:>15.1f}{'-':>12}{'-':>10}")
    print(f"{'elastic_dp.allocate 100x400':<28}{policy_small:>15.2f}")
    print(f"{'goodput_dp.allocate 100x400':<28}{goodput['goodput_100x400_ms']:>15.2f}  ({goodput['goodput_over_elastic_100x400']}x elastic_dp, interleaved)")
    print(f"{'  every noise scale new':<28}{goodput['goodput_cold_100x400_ms']:>15.2f}  ({goodput['goodput_cold_over_elastic_100x400']}x)")
    print(f"brute force: {check['brute_force_mismatches']} mismatches over {check['brute_force_instances']} instances ({check['brute_force_feasible']} feasible)")
    print(
        json.dumps(
            {
                "dp_100x400_ms": round(dp_small, 3),
                "dp_1000x10000_ms": round(dp_large, 1),
                "policy_100x400_ms": round(policy_small, 3),
                "python_dp_100x400_ms": round(python_small, 1),
                "speedup_vs_python_dp": round(python_small / dp_small, 1),
                **goodput,
                **check,
            }
        )
    )


if __name__ == "__main__":
    main()
