"""Pollux's own workloads (OSDI'21 artifact) replayed through our simulator, against Pollux's published mean JCT.

Input: the artifact's ``simulator/`` directory — ``git clone -b osdi21-artifact
https://github.com/petuum/adaptdl`` and pass ``--pollux adaptdl/simulator``. Nothing of it is
stored in this repository: its CSVs are read and converted here, into our jobs (JobSpec with a
profile, a noise scale and B0), then replayed by the product's ``allocator.simulator.simulate``
(what ``malleable simulate`` runs), on goodput physics.

Conversion, per application (``traces/<app>/``):
* profile: the one-GPU step time against the local batch (placement ``1``), its monotone
  envelope (a few points dip); memory cap = the largest local batch traced. Allreduce: our ring
  model fitted (``allocator.physics.topology.fit_topology``) to what a multi-GPU placement adds to the
  one-GPU step at the same local batch (``placements.csv`` and ``scalability.csv``), inside one
  node and across nodes separately; 4 GPUs per node.
* work: Pollux's simulator completes a job after ``max_epochs`` epochs of statistical progress
  (its unit: iterations at the initial batch, the smallest traced); work = that progress x the
  initial batch, in base-batch-equivalent samples with B0 = the initial batch.
* noise scale: per epoch, Pollux's PGNS = B0 x grad_var / grad_sqr (the ``at_batch`` form of
  ``allocator.physics.noise``), the median over the application's traced batch sizes; a step trajectory
  over the fraction of the work done at each epoch's start.
* batch range: [initial batch, largest traced batch] (ncf: 32768 only, as Pollux's simulator pins
  it); max GPUs: min(64, largest batch / smallest traced local batch); ``fixed_batch`` (the
  fixed-batch baseline's) = the workload row's ``batch_size``.
Jobs arrive at the workload rows' times. Costs as Pollux's simulator charges them: 30 s per
allocation change, the first included; batch-only changes free (Pollux re-optimises the batch
between steps); 16 nodes x 4 GPUs; Δ = 60 s; the loop also reacts to arrivals and completions
unless ``--ticks-only``.

Differences that remain (so the figure is ours, not a reproduction of Pollux's simulator):
Pollux's true throughput is its traced step times, interpolated per placement; ours is the
fitted model, placed on as few nodes as possible. Its statistical efficiency uses the gradient
statistics of the batch actually run (interpolated between traced batches); ours the median
noise scale over them at the job's progress. No interference, no cluster autoscaling.

Figures (last line, JSON): per policy the mean over the workloads of the average JCT (s), and
its ratio to Pollux's published 2751 s (the figure issue 27 quotes for these 8 workloads).

Run: python benchmarks/pollux_trace_bench.py --pollux PATH/TO/adaptdl/simulator [--workloads 1 2 ...] [--sweep 1 0 -1]
     [--exponents 0 0.5] [--queues fifo] [--previous]   (--previous: goodput_dp as issue 27 found it)
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocator.loop import LoopSettings
from allocator.metrics import summarise
from allocator.physics.noise import NoiseTrajectory, noise_from_stats
from allocator.policies import make_policy
from allocator.profiles.io import monotone_envelope
from allocator.simulator import RescaleCost, simulate
from allocator.physics.topology import fit_topology
from allocator.types import JobSpec, ThroughputProfile

POLLUX_PUBLISHED_AVG_JCT_S = 2751.0
CAPACITY, GPUS_PER_NODE = 64, 4
# Pollux's simulator: applications.py (max_epochs; yolov3's memory cap) and simulator.py (ncf's pinned batch).
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}
PINNED_BATCH = {"ncf": 32768}
NOMINAL_PARAMS = 10_000_000  # the ring model's p x beta: only the product is fitted


@dataclass(frozen=True, slots=True)
class Application:
    name: str
    profile: ThroughputProfile
    init_batch: int
    max_batch: int
    min_local: int
    work_samples: int
    noise: NoiseTrajectory


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _profile(name: str, directory: Path) -> tuple[ThroughputProfile, int]:
    rows = _rows(directory / "placements.csv")
    single = sorted((int(r["local_bsz"]), float(r["step_time"])) for r in rows if r["placement"] == "1")
    sizes = [b for b, _ in single]
    times = monotone_envelope(tuple(t for _, t in single))
    cap = MAX_LOCAL_BSZ.get(name, max(sizes))
    measurements = []
    for r in rows + [dict(placement="", **s) for s in _rows(directory / "scalability.csv")]:
        if r["placement"]:
            nodes, replicas = len(r["placement"]), sum(int(c) for c in r["placement"])
        else:
            nodes, replicas = int(r["num_nodes"]), int(r["num_replicas"])
        if replicas < 2:
            continue
        extra = float(r["step_time"]) - float(np.interp(int(r["local_bsz"]), sizes, times))
        measurements.append((NOMINAL_PARAMS, replicas, nodes, max(extra, 0.0)))
    intra, inter = fit_topology(measurements)
    keep = [i for i, b in enumerate(sizes) if b <= cap]
    profile = ThroughputProfile(
        workload=name,
        num_params=NOMINAL_PARAMS,
        batch_sizes=tuple(sizes[i] for i in keep),
        iter_times_s=tuple(times[i] for i in keep),
        max_batch_per_gpu=cap,
        allreduce=intra,
        hardware="pollux-osdi21-trace",
        inter_host=inter,
    )
    return profile, min(sizes)


def _pgns(init_batch: int, row: dict[str, str]) -> float:
    """Pollux's PGNS from one epoch's statistics; a gradient with no signal left (|G|^2 = 0) has no noise limit."""
    sqr, var = float(row["grad_sqr"]), float(row["grad_var"])
    return noise_from_stats(init_batch, sqr, var) if sqr > 0 and var > 0 else float("inf")


def load_application(name: str, root: Path) -> Application:
    directory = root / "traces" / name
    profile, min_local = _profile(name, directory)
    validation = {int(p.stem.split("-")[-1]): _rows(p) for p in directory.glob("validation-*.csv")}
    init_batch, max_batch = min(validation), max(validation)
    epochs = MAX_EPOCHS[name]
    # Pollux's get_progress(e): the smallest progress any traced batch had made after epoch e.
    progress = [0.0] + [min(float(rows[e - 1]["progress"]) for rows in validation.values()) for e in range(1, epochs + 1)]
    total = progress[-1]
    pgns = [statistics.median(_pgns(init_batch, rows[e]) for rows in validation.values()) for e in range(epochs)]
    starts = [p / total for p in progress[:-1]]
    noise = NoiseTrajectory((*starts, 1.0), tuple(pgns))
    return Application(name, profile, init_batch, max_batch, min_local, int(round(total * init_batch)), noise)


def load_workload(path: Path, apps: dict[str, Application]) -> list[JobSpec]:
    jobs = []
    for row in _rows(path):
        app = apps[row["application"]]
        lo = hi = PINNED_BATCH[app.name] if app.name in PINNED_BATCH else None
        lo, hi = (lo, hi) if lo is not None else (app.init_batch, app.max_batch)
        jobs.append(
            JobSpec(
                id=row["name"],
                workload=app.name,
                total_samples=app.work_samples,
                min_batch=lo,
                max_batch=hi,
                max_gpus=max(1, min(CAPACITY, hi // app.min_local)),
                profile=app.profile,
                arrival_time=float(row["time"]),
                fixed_batch=min(max(int(row["batch_size"]), lo), hi),
                noise_scale=app.noise,
                base_batch=app.init_batch,
            )
        )
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pollux", type=Path, required=True, help="the artifact's simulator/ directory (workloads/, traces/)")
    parser.add_argument("--workloads", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("--sweep", type=float, nargs="*", default=[], help="also run goodput_dp at these power-mean exponents")
    parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True, help="also run elastic_dp and fixed_batch_dp")
    parser.add_argument("--queues", nargs="*", default=[], help="also run goodput_dp with these queue orders (fifo, response, shortest)")
    parser.add_argument("--exponents", type=float, nargs="*", default=[], help="also run goodput_dp with these remaining_exponent values")
    parser.add_argument("--previous", action="store_true", help="also run goodput_dp as issue 27 found it (p=0, remaining_exponent=0, queue=fifo)")
    parser.add_argument("--cost-blind", action="store_true", help="also run goodput_dp without the rescale cost in its objective")
    parser.add_argument("--ticks-only", action="store_true", help="decide only every Δ (Pollux's simulator), not at arrivals and completions")
    args = parser.parse_args()
    if not (args.pollux / "workloads").is_dir() or not (args.pollux / "traces").is_dir():
        sys.exit(f"--pollux={str(args.pollux)!r}: expected the artifact's simulator/ directory (with workloads/ and traces/)")
    apps = {name: load_application(name, args.pollux) for name in MAX_EPOCHS}
    for app in apps.values():
        print(f"{app.name:12s} B0 {app.init_batch:6d}  batches <= {app.max_batch:6d}  cap/GPU {app.profile.max_batch_per_gpu:4d}  "
              f"work {app.work_samples:>12,d} samples  B_noise {app.noise.values[0]:.0f} -> {app.noise.values[-1]:.0f}", flush=True)  # fmt: skip
    cost = RescaleCost(in_place_s=30.0, start_s=30.0, batch_s=0.0)
    # goodput_dp plans with the run's rescale cost, as `malleable simulate` gives it (--in-place-cost).
    policies = {"goodput_dp": lambda: make_policy("goodput_dp", hosts=GPUS_PER_NODE, rescale_cost_s=cost.in_place_s)}
    for p in args.sweep:
        policies[f"goodput_dp_p{p:g}"] = lambda p=p: make_policy("goodput_dp", hosts=GPUS_PER_NODE, p=p, rescale_cost_s=cost.in_place_s)
    for queue in args.queues:
        policies[f"goodput_dp_q{queue}"] = lambda queue=queue: make_policy("goodput_dp", hosts=GPUS_PER_NODE, queue=queue, rescale_cost_s=cost.in_place_s)
        for p in args.sweep:
            policies[f"goodput_dp_p{p:g}_q{queue}"] = lambda p=p, queue=queue: make_policy(
                "goodput_dp", hosts=GPUS_PER_NODE, p=p, queue=queue, rescale_cost_s=cost.in_place_s
            )
    for e in args.exponents:
        policies[f"goodput_dp_e{e:g}"] = lambda e=e: make_policy("goodput_dp", hosts=GPUS_PER_NODE, remaining_exponent=e, rescale_cost_s=cost.in_place_s)
    if args.previous:
        policies["goodput_dp_previous"] = lambda: make_policy(
            "goodput_dp", hosts=GPUS_PER_NODE, p=0.0, remaining_exponent=0.0, queue="fifo", rescale_cost_s=cost.in_place_s
        )
    if args.cost_blind:
        policies["goodput_dp_cost_blind"] = lambda: make_policy("goodput_dp", hosts=GPUS_PER_NODE, rescale_cost_s=0.0)
    if args.baselines:
        policies["elastic_dp"] = lambda: make_policy("elastic_dp")
        policies["fixed_batch_dp"] = lambda: make_policy("fixed_batch_dp")
    settings = LoopSettings(interval_s=60.0, react_to_events=not args.ticks_only)
    jct: dict[str, list[float]] = {name: [] for name in policies}
    for number in args.workloads:
        jobs = load_workload(args.pollux / "workloads" / f"workload-{number}.csv", apps)
        specs = {j.id: j for j in jobs}
        for name, make in policies.items():
            t0 = time.perf_counter()
            result = simulate(jobs, make(), CAPACITY, settings, cost, gpus_per_host=GPUS_PER_NODE)
            m = summarise(result, specs)
            if m.jobs_completed != len(jobs):
                raise RuntimeError(f"workload {number} {name}: {m.jobs_completed}/{len(jobs)} jobs completed")
            jct[name].append(m.avg_jct_s)
            print(f"workload {number} {name:16s} avg JCT {m.avg_jct_s:7.0f} s  rescales {m.rescales:4d}  batch changes {m.batch_changes:4d}"
                  f"  makespan {m.makespan_s / 3600:5.1f} h  wall {time.perf_counter() - t0:5.1f} s", flush=True)  # fmt: skip
    figures: dict[str, object] = {"workloads": args.workloads, "pollux_published_avg_jct_s": POLLUX_PUBLISHED_AVG_JCT_S, "react_to_events": not args.ticks_only}
    for name, values in jct.items():
        mean = float(np.mean(values))
        figures[f"{name}_mean_avg_jct_s"] = round(mean, 1)
        figures[f"{name}_over_pollux"] = round(mean / POLLUX_PUBLISHED_AVG_JCT_S, 3)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
