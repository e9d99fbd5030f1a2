"""Fair shares on a simulated 64-GPU cluster: a heavy team, a light team arriving later, a nightly deadline job.

The workload (seeded; seed 000's category profiles with constant gradient noise scales, so
goodput physics):

* team ``research`` (quota 48: four people): 40 jobs from four submitters arriving over the
  first 20 minutes, 1-8 hours each on one GPU, up to 8 GPUs each;
* team ``product`` (quota 16: one person): 4 jobs arriving together at 30.5 min, 2-4 hours
  each on one GPU, up to 8 GPUs each (off the decision grid: they wait for a tick);
* ``retrain:nightly`` (a member of research, as the Prefect deployment's submitter): one
  ``nightly`` job at 60.5 min, 3 hours on one GPU, up to 8 GPUs, due 1.25 x its JCT on an empty
  cluster after it arrives.

The same jobs run under the inner policy alone and under ``fair(inner, teams)``, side by side,
with decisions only every Δ = 60 s (no reaction to arrivals: the return bound below is the
tick's, not an event's). Figures per run: each team's max ρ (Themis' finish-time fairness: JCT
/ JCT of its team's jobs alone on its nominal share under the same inner policy), Jain's index
over teams, the nightly job's finish against its deadline, the average JCT of all jobs,
GPU-hours used vs entitled, how long after the product team's arrival research still held more
GPUs than its entitlement (the return delay), restarts (preempted jobs resumed) and in-place
rescales. Targets (issue 36): product's max ρ <= 1.1, the deadline met, average JCT within
5 % of the inner policy alone, borrowed GPUs returned within one Δ.

Seeds 0-4 with quotas 48/16 (the headline), then seed 0 with an even split (32/32), where a
quota of half the cluster for four jobs costs the 40 others more (docs/benchmarks.md).

    python benchmarks/fairness_bench.py [--inner goodput_dp] [--seeds 5]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np

from allocator.fairness.policy import fair
from allocator.fairness.priority import PRIORITY_CLASSES
from allocator.fairness.report import loop_isolate, report_run
from allocator.fairness.shares import entitlements, nominal_shares
from allocator.fairness.teams import Team, TeamTable
from allocator.loop import LoopResult, LoopSettings
from allocator.metrics import summarise
from allocator.physics.noise import NoiseTrajectory
from allocator.physics.throughput import baseline_rate
from allocator.policies import make_policy
from allocator.simulator import RescaleCost, simulate
from allocator.types import JobSpec, RescaleKind
from allocator.workloads.seed000 import load_category_profiles

CAPACITY = 64
SETTINGS = LoopSettings(interval_s=60.0, react_to_events=False)
PRODUCT_ARRIVAL_S = 1830.0
NIGHTLY_ARRIVAL_S = 3630.0
DEADLINE_SLACK = 1.25
PROFILES = load_category_profiles(Path(__file__).resolve().parents[1] / "examples" / "profiles")
# Seed 000's elastic categories: global batch range and a constant gradient noise scale each.
KINDS = {1: (32, 256, 300.0), 2: (16, 256, 120.0), 3: (16, 1024, 500.0)}
COST = RescaleCost()  # 1 s in place, 10 s for a restart (a preempted job's resume)


def teams(research: int, product: int) -> TeamTable:
    return TeamTable((Team("research", quota=research, members=("alice", "bob", "carol", "dave", "retrain:*")), Team("product", quota=product, members=("erin",))))


def _job(rng: np.random.Generator, job_id: str, submitter: str, arrival: float, hours: tuple[float, float], cat: int | None = None, **kw) -> JobSpec:
    cat = int(rng.choice(list(KINDS))) if cat is None else cat
    lo, hi, noise = KINDS[cat]
    profile = PROFILES[cat]
    length_h = float(np.exp(rng.uniform(math.log(hours[0]), math.log(hours[1]))))
    spec = JobSpec(
        id=job_id, workload=profile.workload, total_samples=1, min_batch=lo, max_batch=hi, max_gpus=kw.pop("max_gpus", 8), profile=profile,
        arrival_time=arrival, submitter=submitter, noise_scale=NoiseTrajectory.constant(noise), **kw,
    )  # fmt: skip
    # Work for ``length_h`` hours on one GPU at the job's largest batch there.
    return dataclasses.replace(spec, total_samples=max(1, int(length_h * 3600 * baseline_rate(spec))))


def workload(seed: int, inner: str) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    people = ("alice", "bob", "carol", "dave")
    jobs = [_job(rng, f"r{i:02d}", people[i % 4], float(rng.uniform(0, 1200)), (1.0, 8.0)) for i in range(40)]
    jobs += [_job(rng, f"p{i}", "erin", PRODUCT_ARRIVAL_S, (2.0, 4.0)) for i in range(4)]
    nightly = _job(rng, "nightly", "retrain:nightly", NIGHTLY_ARRIVAL_S, (3.0, 3.0), cat=1, priority=PRIORITY_CLASSES["nightly"])
    alone = simulate([nightly], make_policy(inner), CAPACITY, SETTINGS, COST).record("nightly")
    assert alone.finish is not None
    nightly = dataclasses.replace(nightly, deadline=NIGHTLY_ARRIVAL_S + DEADLINE_SLACK * (alone.finish - alone.arrival))
    return sorted([*jobs, nightly], key=lambda j: (j.arrival_time, j.id))


def team_gpus(result: LoopResult, team_of: dict[str, str], team: str) -> list[tuple[float, int]]:
    """The team's GPUs as a step function: (time, GPUs from then on)."""
    held: dict[str, int] = {}
    out: list[tuple[float, int]] = []
    for row in result.schedule:
        held[row.job_id] = row.gpus
        total = sum(g for j, g in held.items() if team_of[j] == team)
        if out and out[-1][0] == row.time:
            out[-1] = (row.time, total)
        else:
            out.append((row.time, total))
    return out


def return_delay(result: LoopResult, jobs: list[JobSpec], table: TeamTable) -> float | None:
    """Seconds from the product team's arrival until research held no more than its entitlement then
    (both teams' demand at that moment, as ``allocator.fairness.shares`` computes it)."""
    team_of = {j.id: table.team_of(j) for j in jobs}
    present = [j for j in jobs if j.arrival_time <= PRODUCT_ARRIVAL_S and (result.record(j.id).finish or math.inf) > PRODUCT_ARRIVAL_S]
    demand: dict[str, dict[int, int]] = {}
    for j in present:
        tiers = demand.setdefault(team_of[j.id], {})
        tiers[j.priority] = tiers.get(j.priority, 0) + j.max_gpus
    names = table.names(jobs)
    entitled = entitlements(CAPACITY, nominal_shares(table, CAPACITY, names), {n: 1.0 for n in names}, demand)["research"]
    for t, gpus in team_gpus(result, team_of, "research"):
        if t >= PRODUCT_ARRIVAL_S and gpus <= entitled:
            return t - PRODUCT_ARRIVAL_S
    return None


def run(jobs: list[JobSpec], inner: str, table: TeamTable, fairness: bool) -> dict[str, object]:
    policy = fair(make_policy(inner), table, SETTINGS.strict_fifo) if fairness else make_policy(inner)
    t0 = time.perf_counter()
    result = simulate(jobs, policy, CAPACITY, SETTINGS, COST)
    sim_s = time.perf_counter() - t0
    report = report_run(result, jobs, table, loop_isolate(lambda team_jobs, gpus: simulate(team_jobs, make_policy(inner), gpus, SETTINGS, COST)))
    nightly = result.record("nightly")
    deadline = next(j.deadline for j in jobs if j.id == "nightly")
    events = [e.kind for e in result.events]
    return {
        "product_max_rho": report.team("product").max_rho,
        "research_max_rho": report.team("research").max_rho,
        "max_rho": report.max_rho,
        "jain": report.jain,
        "nightly_jct_s": None if nightly.finish is None else nightly.finish - nightly.arrival,
        "nightly_due_s": deadline - NIGHTLY_ARRIVAL_S,
        "deadline_met": nightly.finish is not None and nightly.finish <= deadline,
        "avg_jct_s": summarise(result, {j.id: j for j in jobs}).avg_jct_s,
        "return_delay_s": return_delay(result, jobs, table),
        "restarts": sum(k is RescaleKind.RESTART for k in events),
        "in_place": sum(k is RescaleKind.IN_PLACE for k in events),
        "decisions": result.decisions,
        "sim_s": sim_s,
        "gpu_h": {t.team: (t.used_gpu_h, t.entitled_gpu_h) for t in report.teams if t.jobs},
    }


ROWS = (
    ("product max ρ (target <= 1.1)", "product_max_rho", "{:.3f}"),
    ("research max ρ", "research_max_rho", "{:.3f}"),
    ("Jain over teams (mean 1/ρ)", "jain", "{:.3f}"),
    ("nightly JCT s", "nightly_jct_s", "{:.0f}"),
    ("nightly due s after arrival", "nightly_due_s", "{:.0f}"),
    ("deadline met", "deadline_met", "{}"),
    ("average JCT s", "avg_jct_s", "{:.0f}"),
    ("research over its share after product arrives, s", "return_delay_s", "{:.0f}"),
    ("restarts (preempted, resumed)", "restarts", "{}"),
    ("in-place rescales", "in_place", "{}"),
)


def compare(seed: int, inner: str, table: TeamTable) -> dict[str, object]:
    jobs = workload(seed, inner)
    off, on = run(jobs, inner, table, fairness=False), run(jobs, inner, table, fairness=True)
    quotas = "/".join(str(t.quota) for t in table.teams)
    print(f"\nseed {seed}, quotas research/product {quotas}: {len(jobs)} jobs on {CAPACITY} GPUs, Δ = {SETTINGS.interval_s:g} s, inner {inner}")
    print(f"{'':52} {'fairness off':>13} {'fairness on':>13}")
    for label, key, fmt in ROWS:
        cells = ["-" if r[key] is None else fmt.format(r[key]) for r in (off, on)]
        print(f"{label:52} {cells[0]:>13} {cells[1]:>13}")
    for name, r in (("off", off), ("on", on)):
        print(f"GPU-h used/entitled, fairness {name}: " + ", ".join(f"{t} {u:.1f}/{e:.1f}" for t, (u, e) in r["gpu_h"].items()))  # type: ignore[union-attr]
    ratio = float(on["avg_jct_s"]) / float(off["avg_jct_s"])  # type: ignore[arg-type]
    print(f"average JCT, fairness on / off: {ratio:.4f} (target <= 1.05)")
    keep = [k for _, k, _ in ROWS] + ["max_rho", "decisions", "sim_s"]
    return {"seed": seed, "quotas": quotas, "avg_jct_ratio": round(ratio, 4)} | {f"{k}_{n}": _round(r[k]) for n, r in (("on", on), ("off", off)) for k in keep}


def _round(x: object) -> object:
    return round(x, 4) if isinstance(x, float) else x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inner", default="goodput_dp")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    runs = [compare(seed, args.inner, teams(48, 16)) for seed in range(args.seeds)]
    even = compare(0, args.inner, teams(32, 32))
    ok = [r for r in runs if r["product_max_rho_on"] <= 1.1 and r["deadline_met_on"] and r["avg_jct_ratio"] <= 1.05 and (r["return_delay_s_on"] or 0) <= SETTINGS.interval_s]
    print(f"\nquotas 48/16, seeds 0-{args.seeds - 1}: all four targets met in {len(ok)} of {len(runs)} seeds; "
          f"average JCT ratio mean {np.mean([r['avg_jct_ratio'] for r in runs]):.4f}, worst {max(r['avg_jct_ratio'] for r in runs):.4f}")  # fmt: skip
    summary = {
        "inner": args.inner, "gpus": CAPACITY, "interval_s": SETTINGS.interval_s, "headline": runs[0],
        "seeds_all_targets_met": len(ok), "seeds": len(runs),
        "avg_jct_ratio_mean": round(float(np.mean([r["avg_jct_ratio"] for r in runs])), 4),
        "avg_jct_ratio_worst": max(r["avg_jct_ratio"] for r in runs),
        "product_max_rho_on_worst": max(r["product_max_rho_on"] for r in runs),
        "product_max_rho_off_best": min(r["product_max_rho_off"] for r in runs),
        "return_delay_s_on_worst": max(r["return_delay_s_on"] for r in runs),
        "deadline_met_on": sum(bool(r["deadline_met_on"]) for r in runs), "deadline_met_off": sum(bool(r["deadline_met_off"]) for r in runs),
        "even_split_seed0": even,
    }  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
