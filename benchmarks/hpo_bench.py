"""Seed 001 (RubberBand) in the model: greedy elastic plans vs the best static cluster.

Workloads shaped like the paper's evaluation (V100 profiles calibrated to its Table 1,
p3.8xlarge instances: 4 GPUs, $12.24/h, 10 Gbit/s between instances, per-second billing
with a 60 s minimum):

* ``sha64-resnet50``: SHA(n=64, r=4, R=508, eta=2) (§6.1.1-6.1.3), ResNet-50 at batch 512,
  an iteration = 6 steps (~4 s on one GPU, as in §6.1.1); deadlines 15-40 min.
* ``sha32-resnet101``: SHA(n=32, r=1, R=50 epochs, eta=3) of CIFAR-10 (§6.3.1), ResNet-101
  at batch 1024, 15 s instance start-up; the paper's deadlines 20, 30, 40 min.
* ``sha512-resnet50``: SHA(n=512, r=4, R=4096, eta=2) (§6.1.4, Fig. 12), ResNet-50 at batch
  2048 (~12 s per iteration on one GPU = 4 steps), init latency 1, 10 or 100 s; the paper's
  deadlines 90-160 min.

Per case: the static baseline (cheapest fixed cluster meeting the deadline), the greedy plan
(timed), and whether the greedy plan meets the deadline. Printed last: one JSON object with
``cost_ratio_vs_static`` (median over the cases where a static cluster is feasible),
``deadline_met_fraction`` (greedy meets the deadline / cases where any searched plan does),
``plan_time_s`` (median and max), the paper's Table-1 placement ablation in the model,
greedy vs exhaustive on random small jobs, and Fig. 9's stragglers under both billing modes
(Monte-Carlo).

Run: .venv/bin/python benchmarks/hpo_bench.py [--quick]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time

import numpy as np

from allocator.hpo.model import predict, step_time
from allocator.hpo.placement import stage_spans
from allocator.hpo.planner import NoFeasiblePlanError, exhaustive_plan, greedy_plan, static_baseline
from allocator.hpo.spec import Billing, CloudModel, HpoSpec, InstanceType, Latency, TrialModel, successive_halving
from allocator.types import AllreduceModel, ThroughputProfile

P3_8XL = InstanceType("p3.8xlarge", 4, 12.24, AllreduceModel(5e-5, 3.2e-9))
NVLINK = AllreduceModel(2e-5, 8e-11)


def v100_profile(name: str, params: int, samples_per_s: float, overhead_s: float) -> ThroughputProfile:
    """t_proc(b) = overhead + b / rate, measured at powers of two up to a 256 cap."""
    sizes = (16, 32, 64, 128, 256)
    return ThroughputProfile(name, params, sizes, tuple(overhead_s + b / samples_per_s for b in sizes), 256, NVLINK, "V100 analytical")


RESNET50 = v100_profile("resnet50", 25_600_000, 750.0, 0.02)  # Table 1: ~750 samples/s on one V100
RESNET101 = v100_profile("resnet101", 44_500_000, 400.0, 0.03)  # ~1.9x ResNet-50's cost per sample


def cloud(init_s: float) -> CloudModel:
    return CloudModel(P3_8XL, Billing.PER_INSTANCE, 1.0, 60.0, Latency(init_s), Latency(init_s), max_instances=64, data_gb=0.15)


def cases(quick: bool) -> list[tuple[str, HpoSpec]]:
    out = []
    sha64 = successive_halving(64, 2, 4 * 6, 508 * 6)
    for minutes in (15, 20, 25, 30, 40):
        out.append(("sha64-resnet50", HpoSpec("sha64", sha64, TrialModel(RESNET50, 512, Latency(5.0), Latency(1.0)), cloud(10.0), minutes * 60.0)))
    epoch = 50_000 // 1024
    sha32 = successive_halving(32, 3, epoch, 50 * epoch)
    for minutes in (20, 30, 40):
        out.append(("sha32-resnet101", HpoSpec("sha32", sha32, TrialModel(RESNET101, 1024, Latency(5.0), Latency(1.0)), cloud(15.0), minutes * 60.0)))
    if not quick:
        sha512 = successive_halving(512, 2, 4 * 4, 4096 * 4)
        for init in (1.0, 10.0, 100.0):
            for minutes in (90, 120, 160):
                trial = TrialModel(RESNET50, 2048, Latency(5.0), Latency(1.0))
                out.append((f"sha512-resnet50-init{init:g}s", HpoSpec("sha512", sha512, trial, cloud(init), minutes * 60.0)))
    return out


def run_case(name: str, spec: HpoSpec) -> dict[str, object]:
    row: dict[str, object] = {"workload": name, "deadline_min": spec.deadline_s / 60}
    try:
        static = static_baseline(spec).prediction
        row.update(static_gpus=static.plan[0], static_cost=round(static.cost, 3), static_jct_min=round(static.jct_s / 60, 2))
    except NoFeasiblePlanError:
        static = None
    t0 = time.perf_counter()
    try:
        greedy = greedy_plan(spec)
    except NoFeasiblePlanError:
        greedy = None
    row["plan_time_s"] = round(time.perf_counter() - t0, 4)
    if greedy is not None:
        p = greedy.prediction
        row.update(plan=list(p.plan), cost=round(p.cost, 3), jct_min=round(p.jct_s / 60, 2), met=p.meets(spec.deadline_s), evaluations=greedy.evaluations)
        paper = greedy_plan(spec, refined=False).prediction
        row["paper_greedy_cost"] = round(paper.cost, 3)
        if static is not None:
            row["ratio"] = round(p.cost / static.cost, 4)
            row["paper_greedy_ratio"] = round(paper.cost / static.cost, 4)
    else:
        row["met"] = False
    return row


def placement_ablation() -> dict[str, float]:
    """Table 1 in the model: samples/s of one ResNet-50 trial (batch 1024) on 1, 2, 4 GPUs of
    p3.8xlarge-like 4-GPU instances, co-located vs scattered over 4 instances."""
    trial = TrialModel(RESNET50, 1024)
    out = {}
    for g in (1, 2, 4):
        for label, scattered in (("placed", False), ("scattered", True)):
            spans = stage_spans(1, g, 4, 4, scattered)
            comm = P3_8XL.inter_node_allreduce if spans[0] > 1 else NVLINK
            out[f"{label}_{g}gpu_samples_per_s"] = round(1024 / step_time(trial, g, comm), 1)
    return out


def straggler_effect(samples: int) -> dict[str, float]:
    """Fig. 9 in the model: the SHA(64) 20-minute greedy plan under Monte-Carlo stragglers
    (a run's step time ~ Normal(1, cv) x mean), billed per instance vs per function."""
    base = cases(True)[1][1]
    plan = greedy_plan(base).prediction.plan
    out = {}
    for cv in (0.0, 0.25, 0.5):
        for billing in (Billing.PER_INSTANCE, Billing.PER_FUNCTION):
            spec = dataclasses.replace(base, trial=dataclasses.replace(base.trial, iter_cv=cv), cloud=dataclasses.replace(base.cloud, billing=billing))
            p = predict(spec, plan, samples=samples, rng=np.random.default_rng(1))
            out[f"cv{cv:g}_{billing.value}_cost"] = round(p.cost, 3)
            if billing is Billing.PER_INSTANCE:
                out[f"cv{cv:g}_jct_min"] = round(p.jct_s / 60, 2)
    return out


def greedy_vs_exhaustive(n: int) -> dict[str, float]:
    rng = np.random.default_rng(2026)
    sys.path.insert(0, ".")
    from tests.test_hpo_planner import random_spec

    gaps, missed = [], 0
    for _ in range(n):
        spec = random_spec(rng)
        best = exhaustive_plan(spec).prediction
        got = greedy_plan(spec).prediction
        missed += not got.meets(spec.deadline_s)
        gaps.append(got.cost / best.cost - 1.0)
    g = np.asarray(gaps)
    return {"cases": n, "exact_fraction": float(np.mean(g < 1e-9)), "max_gap": round(float(g.max()), 4), "mean_gap": round(float(g.mean()), 5), "missed_deadlines": missed}


def main() -> None:
    quick = "--quick" in sys.argv
    rows = [run_case(name, spec) for name, spec in cases(quick)]
    for r in rows:
        print(json.dumps(r))
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    paper_ratios = [r["paper_greedy_ratio"] for r in rows if "paper_greedy_ratio" in r]
    solvable = [r for r in rows if "plan" in r or "static_gpus" in r]
    times = [r["plan_time_s"] for r in rows]
    ablation = placement_ablation()
    print(json.dumps(ablation))
    versus = greedy_vs_exhaustive(20 if quick else 60)
    print(json.dumps(versus))
    stragglers = straggler_effect(20 if quick else 100)
    print(json.dumps(stragglers))
    summary = {
        "cost_ratio_vs_static": round(statistics.median(ratios), 4),
        "cost_ratio_vs_static_min": round(min(ratios), 4),
        "cost_ratio_vs_static_max": round(max(ratios), 4),
        "paper_greedy_cost_ratio_vs_static": round(statistics.median(paper_ratios), 4),
        "deadline_met_fraction": round(sum(bool(r.get("met")) for r in solvable) / len(solvable), 4),
        "cases": len(rows),
        "cases_with_static": len(ratios),
        "plan_time_s": round(statistics.median(times), 4),
        "plan_time_s_max": round(max(times), 4),
        "static_cost_total": round(sum(r["static_cost"] for r in rows if "ratio" in r), 2),
        "greedy_cost_total": round(sum(r["cost"] for r in rows if "ratio" in r), 2),
        "placement_speedup_4gpu": round(ablation["placed_4gpu_samples_per_s"] / ablation["scattered_4gpu_samples_per_s"], 3),
        "greedy_exact_vs_exhaustive": round(versus["exact_fraction"], 4),
        "greedy_max_gap_vs_exhaustive": versus["max_gap"],
        "straggler_cv0.5_per_instance_over_per_function": round(stragglers["cv0.5_per_instance_cost"] / stragglers["cv0.5_per_function_cost"], 3),
        "straggler_cv0_per_instance_over_per_function": round(stragglers["cv0_per_instance_cost"] / stragglers["cv0_per_function_cost"], 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
