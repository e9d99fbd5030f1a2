"""goodput_dp vs elastic_dp vs the fixed-batch baseline on the same goodput physics.

Workload: seed 000's 40-GPU bursty setting (categories 1-4, Poisson arrivals alternating
high/low every 2 h for ``--minutes``, queueing, Δ = 10 min), generated per seed. The loop
runs as ``malleable serve``/``run`` run it by default (re-allocating at every arrival and
completion as well as every Δ); ``--ticks-only`` also runs seed 000's autoscaler, which
decides only at the Δ ticks, and reports its ratios under ``*_ticks_only`` keys. Every job's
gradient noise scale follows the trajectory MEASURED for its category's stand-in example
(``benchmarks/data/noise_trajectories.json``, written by ``benchmarks/measure_noise_scale.py``)
over its fraction of work done, given to the job as its ``noise_scale``. Every policy runs
through the product's ``allocator.simulator.simulate`` (what ``malleable simulate`` runs): the
jobs carry noise scales, so the run is on goodput physics, a job progressing by T(B, k) x E(B)
base-batch-equivalent samples per second: a policy that buys throughput with a larger batch
pays for it in samples (McCandlish et al. 2018; Pollux, OSDI'21). Rescales cost the CLI's
defaults (1 s in place; a batch-only change ``RescaleCost.batch_s``).

``goodput_dp`` is the product's default (its default p); ``--sweep`` adds goodput_dp at other
power-mean exponents (``goodput_dp_p<p>``), the evidence for that default (docs/policies.md).

Figures (the last line, JSON): ratios of mean JCTs summed over the seeds, side by side in
one run, plus absolute means (minutes) per policy, p95 JCT and makespan.

``--exponents`` adds goodput_dp at other ``remaining_exponent`` values (``goodput_dp_e<e>``),
``--queues`` at other queue orders (``goodput_dp_q<order>``), ``--previous`` the policy as issue 27
found it (``p=0, remaining_exponent=0, queue=fifo``: the unweighted geometric mean, the loop's FIFO).

Run: python benchmarks/goodput_bench.py [--seeds 0 1 2] [--minutes 480] [--sweep 1 0 -1 -2] [--exponents 0 0.5] [--queues fifo response] [--previous] [--ticks-only]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from allocator.admission import OverflowMode
from allocator.physics.goodput import NoiseTrajectory
from allocator.loop import LoopSettings
from allocator.metrics import summarise
from allocator.policies import make_policy
from allocator.simulator.experiments import SEED000_INTERVAL_S
from allocator.simulator import simulate
from allocator.workloads.arrivals import ArrivalSpec, Pattern, generate_jobs
from allocator.workloads.seed000 import load_category_profiles

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "examples" / "profiles"
TRAJECTORIES = ROOT / "benchmarks" / "data" / "noise_trajectories.json"
CAPACITY = 40


def load_trajectories(path: Path) -> dict[str, NoiseTrajectory]:
    data = json.loads(path.read_text())
    return {
        workload: NoiseTrajectory.from_points(entry["fractions"], entry["noise_scale"])
        for workload, entry in data["workloads"].items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=480.0)
    parser.add_argument("--sweep", type=float, nargs="*", default=[1.0, 0.0, -1.0, -2.0], help="also run goodput_dp at these power-mean exponents")
    parser.add_argument("--queues", nargs="*", default=[], help="also run goodput_dp with these queue orders (fifo, response, shortest)")
    parser.add_argument("--exponents", type=float, nargs="*", default=[], help="also run goodput_dp with these remaining_exponent values")
    parser.add_argument("--previous", action="store_true", help="also run goodput_dp as issue 27 found it (p=0, remaining_exponent=0, queue=fifo)")
    parser.add_argument("--trajectories", type=Path, default=TRAJECTORIES)
    parser.add_argument("--ticks-only", action="store_true", help="also run every policy deciding only at the Δ ticks (seed 000's autoscaler)")
    args = parser.parse_args()
    noise = load_trajectories(args.trajectories)
    profiles = load_category_profiles(PROFILES)
    arrivals = ArrivalSpec(Pattern.BURSTY, args.minutes, period_min=120, scale=CAPACITY / 10)
    # The product's loop (LoopSettings' and `malleable serve`'s default): decide at every
    # arrival and completion, and every Δ. Seed 000's autoscaler decides at the ticks only.
    settings = LoopSettings(interval_s=SEED000_INTERVAL_S, overflow=OverflowMode.QUEUE, react_to_events=True)
    policies = {
        "goodput_dp": lambda seed: make_policy("goodput_dp"),
        "elastic_dp": lambda seed: make_policy("elastic_dp"),
        "fixed_batch_dp": lambda seed: make_policy("fixed_batch_dp", batch_choice="random", seed=seed),
    }
    for p in args.sweep:
        policies[f"goodput_dp_p{p:g}"] = lambda seed, p=p: make_policy("goodput_dp", p=p)
    for queue in args.queues:
        policies[f"goodput_dp_q{queue}"] = lambda seed, queue=queue: make_policy("goodput_dp", queue=queue)
    for e in args.exponents:
        policies[f"goodput_dp_e{e:g}"] = lambda seed, e=e: make_policy("goodput_dp", remaining_exponent=e)
    if args.previous:
        policies["goodput_dp_previous"] = lambda seed: make_policy("goodput_dp", p=0.0, remaining_exponent=0.0, queue="fifo")
    default_p = make_policy("goodput_dp").p  # type: ignore[attr-defined]
    figures: dict = {"seeds": args.seeds, "goodput_dp_p": default_p, "interval_s": settings.interval_s, "react_to_events": settings.react_to_events}
    figures.update(compare(policies, args.seeds, arrivals, profiles, noise, settings, ""))
    if args.ticks_only:
        ticks = compare(policies, args.seeds, arrivals, profiles, noise, replace(settings, react_to_events=False), "_ticks_only")
        figures.update({k: v for k, v in ticks.items() if k != "jobs"})
    print(json.dumps(figures))


def compare(policies: dict, seeds: list[int], arrivals: ArrivalSpec, profiles: dict, noise: dict[str, NoiseTrajectory], settings: LoopSettings, suffix: str) -> dict:
    """Every policy on every seed's trace under ``settings``; figure names end in ``suffix``."""
    jct: dict[str, list[float]] = {name: [] for name in policies}
    p95: dict[str, list[float]] = {name: [] for name in policies}
    makespan: dict[str, list[float]] = {name: [] for name in policies}
    wall: dict[str, float] = {name: 0.0 for name in policies}
    jobs_total = 0
    label = "events+ticks" if settings.react_to_events else "ticks only"
    for seed in seeds:
        jobs = [replace(j, noise_scale=noise[j.workload]) for j in generate_jobs(arrivals, profiles, np.random.default_rng(seed))]
        jobs_total += len(jobs)
        specs = {j.id: j for j in jobs}
        for name, make in policies.items():
            t0 = time.perf_counter()
            result = simulate(jobs, make(seed), CAPACITY, settings)
            wall[name] += time.perf_counter() - t0
            m = summarise(result, specs)
            if m.jobs_completed != len(jobs):
                raise RuntimeError(f"{name} seed {seed}: {m.jobs_completed}/{len(jobs)} jobs completed")
            jct[name].append(m.avg_jct_s)
            p95[name].append(m.p95_jct_s)
            makespan[name].append(m.makespan_s)
            print(f"[{label}] seed {seed} {name:15s} jobs {len(jobs):4d} mean JCT {m.avg_jct_s / 60:7.1f} min  p95 {m.p95_jct_s / 60:7.1f} min"
                  f"  makespan {m.makespan_s / 60:7.1f} min  wall {time.perf_counter() - t0:5.1f} s", flush=True)
    mean = {name: float(np.mean(v)) for name, v in jct.items()}
    figures = {
        f"goodput_over_elastic_dp_avg_jct{suffix}": round(mean["goodput_dp"] / mean["elastic_dp"], 4),
        f"goodput_over_fixed_batch_dp_avg_jct{suffix}": round(mean["goodput_dp"] / mean["fixed_batch_dp"], 4),
        f"goodput_p95_over_elastic_dp{suffix}": round(float(np.mean(p95["goodput_dp"])) / float(np.mean(p95["elastic_dp"])), 4),
        "jobs": jobs_total,
    }
    for name in policies:
        if name.startswith(("goodput_dp_p", "goodput_dp_q", "goodput_dp_e")):
            figures[f"{name}_over_elastic_dp_avg_jct{suffix}"] = round(mean[name] / mean["elastic_dp"], 4)
    for name in policies:
        figures[f"{name}_avg_jct_min{suffix}"] = round(mean[name] / 60, 2)
        figures[f"{name}_p95_jct_min{suffix}"] = round(float(np.mean(p95[name])) / 60, 2)
        figures[f"{name}_makespan_min{suffix}"] = round(float(np.mean(makespan[name])) / 60, 2)
        figures[f"{name}_wall_s{suffix}"] = round(wall[name], 2)
    return figures


if __name__ == "__main__":
    main()
