"""Pollux's own workloads (OSDI'21 artifact) replayed through our simulator, against Pollux's published runs.

Input: the artifact's ``simulator/`` directory — ``git clone -b osdi21-artifact
https://github.com/petuum/adaptdl`` and pass ``--pollux adaptdl/simulator``. Nothing of it is
stored in this repository: its CSVs are read and converted by ``benchmarks/pollux_trace.py``, into
our jobs (JobSpec with a profile, a noise scale and B0), then replayed by the product's
``allocator.simulator.simulate`` (what ``malleable simulate`` runs), on goodput physics.

Conversion, per application (``traces/<app>/``):
* profile: the one-GPU step time against the local batch (placement ``1``), each lowered to the
  least time at it or a larger batch up to the memory cap (``pollux_trace.padded_envelope``: yolov3's
  8 per GPU is faster than its 6 in nearly every placement traced, and Pollux's simulator takes the
  traced time as the truth); memory cap = the largest local batch traced. Allreduce: our ring
  model, inside one node and across nodes separately, and the overlap γ of Pollux's step model
  (compute^γ + allreduce^γ)^(1/γ), fitted together (``allocator.physics.topology.fit_overlapped_topology``)
  to every multi-GPU step traced (``placements.csv`` and ``scalability.csv``) against the one-GPU
  step traced at the same local batch; 4 GPUs per node.
* work: Pollux's simulator completes a job after ``max_epochs`` epochs of statistical progress
  (its unit: iterations at the initial batch, the smallest traced); work = that progress x the
  initial batch, in base-batch-equivalent samples with B0 = the initial batch.
* noise scale: per epoch, Pollux's PGNS = B0 x grad_var / grad_sqr (the ``at_batch`` form of
  ``allocator.physics.noise``) of each traced batch, and the one B_noise whose efficiency fits
  Pollux's over the traced batches best (``pollux_trace.fitted_noise_scale``); a step trajectory
  over the fraction of the work done at each epoch's start.
* batch range: [initial batch, largest traced batch] (ncf: 32768 only, as Pollux's simulator pins
  it); max GPUs: min(64, largest batch / smallest traced local batch); ``fixed_batch`` (the
  fixed-batch baseline's) = the workload row's ``batch_size``.

Fidelity, as Pollux's simulator: 16 nodes x 4 GPUs; 30 s per allocation change, the start
included; batch-only changes free; decisions on Δ = 60 s ticks only (``--react`` also decides at
arrivals and completions); jobs report their noise scale as trainers measure it.

Differences that remain (so the figure is ours, not a reproduction of Pollux's simulator):
Pollux's true throughput is its traced step times, interpolated per placement; ours is the
fitted model (smooth where the traced points scatter ±10 %), placed on as few nodes as possible. Its
statistical efficiency uses the gradient statistics of the batch actually run (interpolated
between traced batches); ours one fitted noise scale per epoch at the job's progress. No interference, no cluster autoscaling, no
preemption to zero GPUs.

Workloads: ``--load 1.0`` (``workloads/``, the 8 workloads the defaults were chosen on: in-sample)
or the artifact's other loads, 0.5, 1.5 and 2.0 (``workloads-<load>/``: 80, 240 and 320 jobs per
workload, other arrivals and job mixes, never used to choose a default: hold-out). Pollux's
published run of each (``results-jobload/pollux-<load>``) gives each job's JCT, so its mean, p95
and makespan per workload; a ratio is the mean over the workloads of ours over the mean of Pollux's.

Size errors: ``--size-error 0.5 2`` declares each job's work as its true work times a factor drawn
uniformly from [0.5, 2] (``--size-seed``; the simulated job still does its true work,
``JobSpec.actual_samples``); ``--mark-estimates`` also marks those jobs ``size: estimate``.

Per workload it also names the job that finished last, ours and Pollux's (the makespan's job), and per
variant each application's sum of JCTs over Pollux's, with its share of ours (what the mean is made of).

Figures (last line, JSON): per policy variant the mean over the workloads of the average JCT, p95
JCT and makespan (s) and each one's ratio to Pollux's published run.

Run: python benchmarks/pollux_trace_bench.py --pollux PATH/TO/adaptdl/simulator [--load 1.0] [--workloads 1 2 ...]
     [-p goodput_dp -p goodput_dp:sizes=ignore ...] [--size-error 0.5 2] [--mark-estimates] [--react] [--workers 2]
     [--write-jobs DIR]  (each workload as a jobs file for `malleable simulate`)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pollux_trace import CAPACITY, GPUS_PER_NODE, LOADS, MAX_EPOCHS, load_application, load_workload, published, workload_path, write_jobs_file  # noqa: E402

from allocator.loop import LoopSettings  # noqa: E402
from allocator.metrics import summarise  # noqa: E402
from allocator.policies import parse_policy, policy_parameters  # noqa: E402
from allocator.simulator import RescaleCost, simulate  # noqa: E402
from allocator.types import JobSpec, SizeKnowledge  # noqa: E402

DEFAULT_POLICIES = ("goodput_dp", "goodput_dp:sizes=ignore", "goodput_dp:p=-1,remaining_exponent=0,queue=fifo", "elastic_dp", "fixed_batch_dp")
COST = RescaleCost(in_place_s=30.0, start_s=30.0, batch_s=0.0)


def with_size_error(jobs: list[JobSpec], low: float, high: float, seed: int, mark: bool) -> list[JobSpec]:
    """Each job declares its true work times a factor uniform in [low, high]; it still does its true work."""
    rng = np.random.default_rng(seed)
    size = SizeKnowledge.ESTIMATE if mark else SizeKnowledge.EXACT
    return [replace(j, total_samples=max(1, int(round(j.total_samples * rng.uniform(low, high)))), actual_samples=j.total_samples, size=size) for j in jobs]


def _run(task: tuple) -> tuple[str, int, dict[str, float], dict[str, float], float]:
    """One workload under one variant (a process of the pool): its mean, p95 and makespan, and each job's JCT."""
    root, load, number, label, text, react, size_error, size_seed, mark = task
    apps = {name: load_application(name, root) for name in MAX_EPOCHS}
    jobs = load_workload(workload_path(root, load, number), apps)
    if size_error is not None:
        jobs = with_size_error(jobs, *size_error, seed=size_seed + number, mark=mark)
    variant = parse_policy(text)
    if "hosts" in policy_parameters(variant.name):
        variant = variant.with_defaults({"hosts": GPUS_PER_NODE})
    t0 = time.perf_counter()
    result = simulate(jobs, variant.build(), CAPACITY, LoopSettings(interval_s=60.0, react_to_events=react), COST, gpus_per_host=GPUS_PER_NODE)
    m = summarise(result, {j.id: j for j in jobs})
    if m.jobs_completed != len(jobs):
        raise RuntimeError(f"load {load} workload {number} {label}: {m.jobs_completed}/{len(jobs)} jobs completed")
    jct = {r.job_id: r.finish - r.arrival for r in result.jobs if r.finish is not None}
    figures = {"mean": m.avg_jct_s or 0.0, "p95": m.p95_jct_s or 0.0, "makespan": m.makespan_s, "rescales": m.rescales}
    return label, number, figures, jct, time.perf_counter() - t0


def application(job_id: str) -> str:
    return job_id.rsplit("-", 1)[0]


def last_finisher(jct: dict[str, float], arrival: dict[str, float]) -> str:
    return max(jct, key=lambda j: arrival[j] + jct[j])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pollux", type=Path, required=True, help="the artifact's simulator/ directory (workloads*/, traces/, results-jobload/)")
    parser.add_argument("--load", choices=LOADS, default="1.0", help="the artifact's job load: 1.0 in-sample, 0.5/1.5/2.0 hold-out")
    parser.add_argument("--workloads", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("-p", "--policy", action="append", help=f"policy variant, repeatable (default: {', '.join(DEFAULT_POLICIES)})")
    parser.add_argument("--react", action="store_true", help="also decide at arrivals and completions (default: Δ ticks only, as Pollux's simulator)")
    parser.add_argument("--size-error", type=float, nargs=2, metavar=("LOW", "HIGH"), help="declare each job's work times a factor uniform in [LOW, HIGH]")
    parser.add_argument("--size-seed", type=int, default=38)
    parser.add_argument("--mark-estimates", action="store_true", help="with --size-error: mark the jobs size: estimate")
    parser.add_argument("--workers", type=int, default=1, help="processes")
    parser.add_argument("--write-jobs", type=Path, help="write each workload as a jobs file into this directory and stop")
    args = parser.parse_args()
    root: Path = args.pollux
    if not all((root / d).is_dir() for d in ("workloads", "traces", "results-jobload")):
        sys.exit(f"--pollux={str(root)!r}: expected the artifact's simulator/ directory (with workloads/, traces/ and results-jobload/)")
    missing = [n for n in args.workloads if not workload_path(root, args.load, n).is_file()]
    if missing:
        sys.exit(f"--workloads={missing!r}: no such workload at load {args.load} (the artifact has workload-1 ... workload-8)")
    texts = args.policy or list(DEFAULT_POLICIES)
    variants = {parse_policy(t).label: t for t in texts}  # a bad variant fails here, naming the parameter
    apps = {name: load_application(name, root) for name in MAX_EPOCHS}
    if args.write_jobs is not None:
        args.write_jobs.mkdir(parents=True, exist_ok=True)
        for number in args.workloads:
            jobs = load_workload(workload_path(root, args.load, number), apps)
            if args.size_error is not None:
                jobs = with_size_error(jobs, *args.size_error, seed=args.size_seed + number, mark=args.mark_estimates)
            write_jobs_file(jobs, apps, args.write_jobs / f"load{args.load}-workload-{number}.yaml")
        print(f"wrote {len(args.workloads)} jobs files to {args.write_jobs}")
        return
    for app in apps.values():
        print(f"{app.name:12s} B0 {app.init_batch:6d}  batches <= {app.max_batch:6d}  cap/GPU {app.profile.max_batch_per_gpu:4d}  "
              f"work {app.work_samples:>12,d} samples  B_noise {app.noise.values[0]:.0f} -> {app.noise.values[-1]:.0f}  overlap γ {app.profile.overlap:g}", flush=True)  # fmt: skip
    error = tuple(args.size_error) if args.size_error else None
    tasks = [(root, args.load, n, label, text, args.react, error, args.size_seed, args.mark_estimates) for n in args.workloads for label, text in variants.items()]
    ours: dict[str, dict[int, dict[str, float]]] = {label: {} for label in variants}
    # Per variant and application: the sum of its jobs' JCTs, ours and Pollux's (what the mean is made of).
    by_app: dict[str, dict[str, list[float]]] = {label: {} for label in variants}
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for label, number, figures, jct, wall in pool.map(_run, tasks):
            ours[label][number] = figures
            pub = published(root, args.load, number)
            for job_id, value in jct.items():
                sums = by_app[label].setdefault(application(job_id), [0.0, 0.0, 0])
                sums[0] += value
                sums[1] += pub.jct[job_id]
                sums[2] += 1
            last, their_last = last_finisher(jct, pub.arrival), last_finisher(pub.jct, pub.arrival)
            print(f"load {args.load} workload {number} {label:50s} avg JCT {figures['mean']:7.0f} s (Pollux {pub.mean:6.0f})  p95 {figures['p95']:7.0f} "
                  f"({pub.p95:6.0f})  makespan {figures['makespan']:7.0f} ({pub.makespan:6.0f})  rescales {figures['rescales']:4.0f}  wall {wall:5.1f} s", flush=True)  # fmt: skip
            print(f"    last to finish: ours {last} (JCT {jct[last]:.0f} s, Pollux's {pub.jct[last]:.0f} s); Pollux's {their_last} (ours {jct[their_last]:.0f} s)", flush=True)
    for label, apps_sums in by_app.items():
        shares = "  ".join(f"{app} {o / t:.2f} ({n}, {o / sum(v[0] for v in apps_sums.values()):.0%})" for app, (o, t, n) in sorted(apps_sums.items()))
        print(f"{label}: JCT over Pollux's by application (jobs, share of our JCT sum): {shares}")
    pollux = {n: published(root, args.load, n) for n in args.workloads}
    theirs = {"mean": np.mean([p.mean for p in pollux.values()]), "p95": np.mean([p.p95 for p in pollux.values()]), "makespan": np.mean([p.makespan for p in pollux.values()])}
    out: dict[str, object] = {
        "load": args.load, "sample": "in-sample" if args.load == "1.0" else "hold-out", "workloads": args.workloads,
        "decisions": "ticks, arrivals and completions" if args.react else "ticks only", "interval_s": 60.0, "start_cost_s": COST.start_s,
        "change_cost_s": COST.in_place_s, "size_error": list(error) if error else None, "size_seed": args.size_seed if error else None,
        "marked_estimates": bool(error and args.mark_estimates),
        "pollux": {k: round(float(v), 1) for k, v in theirs.items()},
    }  # fmt: skip
    for label, per_workload in ours.items():
        for key in ("mean", "p95", "makespan"):
            value = float(np.mean([per_workload[n][key] for n in args.workloads]))
            out[f"{label}|{key}_s"] = round(value, 1)
            out[f"{label}|{key}_over_pollux"] = round(value / float(theirs[key]), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
