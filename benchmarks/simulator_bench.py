"""Simulator speed on seed 000's largest setting: 400 GPUs, bursty arrivals for 480 minutes.

elastic_dp and the random-BS fixed-batch baseline on the same generated trace (seed 0),
re-allocating every Δ = 10 min as the paper's autoscaler does, with jobs dropped when they do
not fit (the setting with the most admission work). Also timed: the same trace with the
loop reacting to every arrival and completion, for comparison.

Figures:
  sim_400gpu_480min_bursty_s   wall seconds, elastic_dp, Δ = 600 s
  events_per_s                 (arrivals + completions + decisions) / wall seconds, same run
  baseline_s                   the same run with fixed_batch_dp (random batch)
  event_driven_s               elastic_dp re-allocating on every arrival/completion too
  completed_ratio_vs_baseline  jobs completed, elastic / baseline (drop mode)

Run: python benchmarks/simulator_bench.py [--quick]   (--quick: no event-driven run, the only part
over a second; its two figures are then left out)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from allocator.admission import OverflowMode
from allocator.loop import LoopSettings
from allocator.metrics import summarise
from allocator.policies import make_policy
from allocator.simulator import simulate
from allocator.simulator.experiments import SEED000_INTERVAL_S
from allocator.workloads.arrivals import ArrivalSpec, generate_jobs
from allocator.workloads.seed000 import load_category_profiles

PROFILES = Path(__file__).resolve().parents[1] / "examples" / "profiles"


def timed(jobs, policy, settings):
    t0 = time.perf_counter()
    result = simulate(jobs, policy, 400, settings)
    return result, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="leave out the event-driven run (~50 s of the ~52)")
    args = parser.parse_args()
    profiles = load_category_profiles(PROFILES)
    jobs = generate_jobs(ArrivalSpec("bursty", 480, period_min=120, scale=40), profiles, np.random.default_rng(0))
    specs = {j.id: j for j in jobs}
    periodic = LoopSettings(interval_s=SEED000_INTERVAL_S, overflow=OverflowMode.DROP, react_to_events=False)

    elastic, elastic_s = timed(jobs, make_policy("elastic_dp"), periodic)
    baseline, baseline_s = timed(jobs, make_policy("fixed_batch_dp", batch_choice="random"), periodic)
    evented, evented_s = (None, None) if args.quick else timed(jobs, make_policy("elastic_dp"), LoopSettings(interval_s=SEED000_INTERVAL_S, overflow=OverflowMode.DROP, react_to_events=True))

    m_el, m_base = summarise(elastic, specs), summarise(baseline, specs)
    events = len(jobs) + m_el.jobs_completed + elastic.decisions
    print(f"trace: {len(jobs)} jobs, 400 GPUs, bursty 2 h/2 h, 480 min")
    print(f"{'run':<34}{'wall s':>8}{'decisions':>11}{'completed':>11}")
    print(f"{'elastic_dp, Δ=600 s':<34}{elastic_s:>8.2f}{elastic.decisions:>11}{m_el.jobs_completed:>11}")
    print(f"{'fixed_batch_dp random, Δ=600 s':<34}{baseline_s:>8.2f}{baseline.decisions:>11}{m_base.jobs_completed:>11}")
    if evented is not None:
        print(f"{'elastic_dp, every event':<34}{evented_s:>8.2f}{evented.decisions:>11}{summarise(evented, specs).jobs_completed:>11}")
    figures = {
        "sim_400gpu_480min_bursty_s": round(elastic_s, 3),
        "events_per_s": round(events / elastic_s, 1),
        "jobs": len(jobs),
        "decisions": elastic.decisions,
        "baseline_s": round(baseline_s, 3),
        "completed_ratio_vs_baseline": round(m_el.jobs_completed / m_base.jobs_completed, 3),
    }
    if evented is not None:
        figures |= {"event_driven_s": round(evented_s, 2), "event_driven_decisions": evented.decisions}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
