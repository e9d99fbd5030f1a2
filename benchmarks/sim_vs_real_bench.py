"""Simulated vs real: one jobs file through the ``simulate`` flow and the ``cluster`` flow.

The model is profiled on this machine first (the profile flow, one torch thread per worker as
the trainer's ranks use), the jobs file is written with that profile, then the same file runs
(1) through the loop with the modelled executor and (2) for real: gloo ranks on Dask workers,
the same policy, Δ and admission. Printed: per-job JCTs side by side and their difference;
the last line is one JSON object.

``--refit``: the real run first, then the simulator on what that run measured. Each job's
model is refitted from its own steps (``allocator.profiles.refit``, the offline profile a weak prior:
world size, per-rank micro-batch and accumulation under the memory cap, one host, each step's
``StepRecord.wall_s``, the first ``WARMUP_STEPS`` of every generation dropped) and written as
that job's profile. What a job costs beyond its steps is measured from the same run: its
running time (finish - start, i.e. JCT minus queue wait) minus the sum of its step times minus
the pauses its in-place rescales measured leaves the fixed part — rank launch and rendezvous,
the final evaluation, noticing the end; the median over jobs is the simulator's start cost,
and the median measured in-place pause its in-place cost. ``--runs N`` repeats real run, refit
and simulation N times; the last JSON line gives each run's mean and max |JCT difference| and
their median and spread over runs. Jobs should each run >= 2 minutes (the default sizes do on
the 2-core dev box with 2 workers, ``min_job_run_s`` says); ``--samples`` makes a quick check.

    .venv/bin/python benchmarks/sim_vs_real_bench.py [--workers 2] [--model resnet_small] [--profile-on-worker | --calibrate]
    .venv/bin/python benchmarks/sim_vs_real_bench.py --refit [--runs 3] [--samples A B C]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from allocator.profiles.io import profile_to_dict

WARMUP_STEPS = 3  # steps dropped at the start of each generation: slow after a start or regroup (refit_bench)
SAMPLES = [16384, 8192, 8192]
# Each job >= 2 min even alone on both workers: resnet_small at batch 256 on 2 workers measured
# 97 ms a step here (2,640 samples/s; 2026-11-25, quick --refit run), so >= 317k samples each.
REFIT_SAMPLES = [737280, 491520, 491520]
JOB_IDS = ["job-a", "job-b", "job-c"]
REAL_CHECKPOINT_EVERY = 50  # the cluster flow's jobs checkpoint every 50 steps (flows.cluster_flow.drive)
CALIBRATE_CHECKPOINT_EVERY = 5
# Long enough that the jobs' steps overlap for most of their run though they start a second apart.
CALIBRATE_STEPS = 60
SPLIT_PARTS = ("steps_s", "checkpoint_s", "evaluation_s", "start_s", "regroup_s", "state_transfer_s", "waiting_s", "unaccounted_s", "wall_s")


def print_splits(real: dict, sim: dict) -> dict:
    """Each job's wall time split, real and simulated side by side; the JSON's per-job figures."""
    out = {}
    for j in sorted(real):
        r, m = real[j].as_dict(), sim[j].as_dict() if j in sim else {}
        print(f"{j} wall split: {'part':16} {'real s':>9} {'sim s':>9}")
        for part in SPLIT_PARTS:
            print(f"{'':{len(j) + 13}}{part:16} {r[part]:9.2f} {m.get(part, float('nan')):9.2f}")
        out[j] = {"real": r, "sim": m, "unaccounted_pct": round(real[j].unaccounted_pct, 2)}
    return out


def calibrate_on_workers(entrypoint: str, batches: list[int], steps: int, checkpoint_dir: Path, workers: int) -> tuple[list[float], float, float]:
    """The elastic trainer itself, one single-rank job on *each* of ``workers`` workers at once:
    median step time per per-GPU batch, the fixed seconds a job costs beyond its steps and
    checkpoint writes, and the seconds one write costs.

    All workers run at once because that is how the cluster runs: the jobs keep every worker
    busy, and on this box the "GPUs" are cores of one socket that share memory bandwidth and
    caches (and the scheduler and client share them too). One job alone on one worker, the
    other core idle, ran its steps ~35 % faster than the same job beside another one (106 ms
    against 164 ms per step of resnet_small at batch 128, stop 32), and the simulator, given the
    lone figure, predicted every JCT ~36 % short. On GPUs, whose devices do not share compute,
    the two figures coincide; measuring under the load the jobs will see is right for both.

    Each job's wall time (``start`` to a collected result) is split by its ranks' timelines
    (``allocator.wall_split``): the fixed part is what a job pays once whatever its length —
    start, regroup, state transfer, the final evaluation, waiting for the end — and the
    simulator charges it as its start cost; the checkpoint part over the writes made
    (``CALIBRATE_CHECKPOINT_EVERY`` steps apart) is a write's cost.
    """
    from distributed import Client

    from allocator.wall_split import job_split
    from deploy.clusters import connect
    from elastic_tasks.cluster import WorkerPool, warm_up
    from elastic_tasks.coordinator.job import JobCoordinator
    from elastic_tasks.protocol import TrainConfig

    step_s, fixed_s, write_s = [], [], []
    with connect("local", workers=workers) as client:
        assert isinstance(client, Client)
        warm_up(client, entrypoint)
        pool = WorkerPool(client)
        for b in batches:
            jobs = []
            for w in range(workers):
                name = f"calibrate-{b}-{w}"
                config = TrainConfig(global_batch=b, max_steps=steps, checkpoint_dir=str(checkpoint_dir / name), checkpoint_every=CALIBRATE_CHECKPOINT_EVERY)
                job = JobCoordinator(client, pool, name, entrypoint, config)
                jobs.append((job, time.time()))
                job.start(1, b)
            times = []
            for job, t0 in jobs:
                result = job.wait(timeout=300)
                split = job_split([r.wall for r in result.ranks], t0, time.time())
                times += [h.wall_s for h in result.history[3:]]  # the first steps warm up
                writes = steps // CALIBRATE_CHECKPOINT_EVERY + 1  # the periodic ones and the final one
                write_s.append(split.checkpoint_s / writes)
                fixed_s.append(split.wall_s - split.steps_s - split.checkpoint_s)
                print(f"calibrate batch {b} ({job.job_id}): " + ", ".join(f"{k} {v:.2f}" for k, v in split.as_dict().items()))
            step_s.append(statistics.median(times))
    return step_s, statistics.median(fixed_s), statistics.median(write_s)


def profile_on_one_worker(entrypoint: str, profile):
    """The same profiler, run as a task on a Dask worker of the kind the jobs train on (the
    flow measures in its own process, which runs the same code faster than a worker does)."""
    import dataclasses

    from deploy.clusters import connect
    from elastic_tasks.cluster import warm_up
    from elastic_tasks.profiling.on_workers import submit_profile
    from elastic_tasks.profiling.profiler import ProfileSettings

    settings = ProfileSettings(batch_sizes=profile.batch_sizes, repeats=5, warmup=2, threads=1)
    with connect("local", workers=1) as client:
        warm_up(client, entrypoint)
        report = submit_profile(client, entrypoint, settings, profile.allreduce).result()
    return dataclasses.replace(profile, iter_times_s=report.profile.iter_times_s)


def generations(history) -> list[list]:
    """A job's steps cut into generations: contiguous runs of one (world size, global batch)."""
    runs: list[list] = []
    for h in history:
        if not runs or (runs[-1][0].world_size, runs[-1][0].global_batch) != (h.world_size, h.global_batch):
            runs.append([])
        runs[-1].append(h)
    return runs


def refit_profile(history, prior):
    """The job's model fitted on its own steps (``allocator.profiles.refit``; ``prior`` only where the steps say
    nothing). A job that never ran on several ranks keeps the prior's allreduce."""
    from allocator.profiles.refit import OnlineThroughputFit, StepObservation
    from elastic_tasks.rank.scaling import accumulation_steps

    fit, several = OnlineThroughputFit(prior.num_params, prior=prior), False
    for gen in generations(history):
        for h in gen[WARMUP_STEPS:]:
            k, b = h.world_size, h.global_batch
            accum = accumulation_steps(b, k, prior.max_batch_per_gpu)
            if h.wall_s > 0:  # a local cluster: every job on one host
                fit.add([StepObservation(k, -(-b // (k * accum)), accum, 1, h.wall_s)])
                several |= k > 1
    fitted = fit.fit().to_profile(prior.workload, prior.num_params, prior.max_batch_per_gpu, hardware=f"{prior.hardware} (refitted)")
    return fitted if several else dataclasses.replace(fitted, allreduce=prior.allreduce)


def fixed_costs(result, job_results) -> dict[str, float]:
    """Per finished job: running time (JCT minus queue wait) minus its step times minus its measured in-place pauses."""
    out = {}
    for rec in result.jobs:
        if rec.start is None or rec.finish is None or rec.job_id not in job_results:
            continue
        steps = sum(h.wall_s for h in job_results[rec.job_id].history)
        pauses = sum(e.cost_s for e in result.events if e.job_id == rec.job_id and e.kind.value == "in_place" and e.cost_s is not None)
        out[rec.job_id] = rec.finish - rec.start - steps - pauses
    return out


def write_jobs_file(path: Path, args, profiles: dict) -> None:
    """``profiles``: name -> profile; a job uses the one named after it, else the model's."""
    path.write_text(
        yaml.safe_dump(
            {
                "gpus": args.workers,
                "policy": "elastic_dp",
                "profiles": {name: profile_to_dict(p) for name, p in profiles.items()},
                "jobs": [
                    {"id": j, "workload": args.model, "profile": j if j in profiles else args.model, "samples": n, "min_batch": 32, "max_batch": 256, "max_gpus": args.workers, "arrival_s": a}
                    for j, n, a in zip(JOB_IDS, args.samples, args.arrivals)
                ],
            },
            sort_keys=False,
        )
    )


def compare_jcts(sim, real) -> tuple[dict, dict, dict]:
    sim_jct = {o.job_id: o.jct_s for o in sim.outcomes}
    real_jct = {o.job_id: o.jct_s for o in real.recorded.outcomes}
    diff = {j: 100.0 * (sim_jct[j] - real_jct[j]) / real_jct[j] for j in real_jct if real_jct[j] and sim_jct.get(j)}
    print(f"{'job':8} {'sim JCT s':>10} {'real JCT s':>11} {'diff %':>8}")
    for j in sorted(real_jct):
        print(f"{j:8} {sim_jct[j]:10.1f} {real_jct[j]:11.1f} {diff.get(j, float('nan')):8.1f}")
    real_events = [(round(e.time, 1), e.job_id, e.kind.value, e.after.gpus if e.after else 0, None if e.cost_s is None else round(e.cost_s, 3)) for e in real.result.events]
    sim_events = [(round(e.time, 1), e.job_id, e.kind.value, e.after.gpus if e.after else 0) for e in sim.result.events]
    print("real events:", real_events)
    print("sim events: ", sim_events)
    return sim_jct, real_jct, diff


def step_gaps(job_results, profile_of) -> dict[str, list[dict]]:
    """Per generation of each job: the median measured step against the model it was simulated with."""
    from allocator.physics.throughput import t_comm, t_proc

    gaps: dict[str, list[dict]] = {}
    for j, r in sorted(job_results.items()):
        profile = profile_of(j)
        for gen in generations(r.history):
            first = gen[0]
            per_gpu = -(-first.global_batch // first.world_size)
            modelled = t_proc(profile, per_gpu) + t_comm(profile.allreduce, profile.num_params, first.world_size)
            measured = statistics.median(h.wall_s for h in gen)
            gaps.setdefault(j, []).append({"gpus": first.world_size, "batch": first.global_batch, "steps": len(gen), "measured_step_s": round(measured, 4), "modelled_step_s": round(modelled, 4)})
            print(f"{j}: {len(gen)} steps on {first.world_size} GPUs x batch {first.global_batch}: median step {measured * 1000:.1f} ms measured vs {modelled * 1000:.1f} ms modelled")
    return gaps


def refit_runs(args, profile, state: Path) -> list[dict]:
    """Real run, refit from its steps, simulation of the refitted jobs; ``args.runs`` times."""
    from flows.cluster_flow import cluster_flow
    from flows.simulate_flow import simulate_flow

    jobs_file = state / "jobs.yaml"
    write_jobs_file(jobs_file, args, {args.model: profile})
    runs = []
    for run in range(args.runs):
        real = cluster_flow(str(jobs_file), workers=args.workers, interval_s=args.interval, react=True, run_name=f"real-{run}")
        refitted = {j: refit_profile(r.history, profile) for j, r in real.job_results.items()}
        fixed = fixed_costs(real.result, real.job_results)
        start_cost_s = statistics.median(fixed.values())
        in_place = [e.cost_s for e in real.result.events if e.kind.value == "in_place" and e.cost_s is not None]
        in_place_cost_s = statistics.median(in_place) if in_place else args.in_place_cost
        refit_file = state / f"jobs-refit-{run}.yaml"
        write_jobs_file(refit_file, args, {args.model: profile, **refitted})
        sim = simulate_flow(str(refit_file), gpus=args.workers, interval_s=args.interval, react=True, in_place_cost_s=in_place_cost_s, start_cost_s=start_cost_s, run_name=f"simulated-refit-{run}")
        sim_jct, real_jct, diff = compare_jcts(sim, real)
        running = [r.finish - r.start for r in real.result.jobs if r.start is not None and r.finish is not None]
        print(f"run {run}: start cost {start_cost_s:.2f} s (per job {', '.join(f'{j} {v:.2f}' for j, v in sorted(fixed.items()))}), in-place cost {in_place_cost_s:.3f} s")
        runs.append(
            {
                "jct_sim_s": {j: round(v, 2) for j, v in sorted(sim_jct.items())},
                "jct_real_s": {j: round(v, 2) for j, v in sorted(real_jct.items())},
                "jct_diff_pct": {j: round(v, 1) for j, v in sorted(diff.items())},
                "mean_abs_jct_diff_pct": round(statistics.mean(abs(v) for v in diff.values()), 1),
                "max_abs_jct_diff_pct": round(max(abs(v) for v in diff.values()), 1),
                "sim_start_cost_s": round(start_cost_s, 2),
                "fixed_cost_per_job_s": {j: round(v, 2) for j, v in sorted(fixed.items())},
                "sim_in_place_cost_s": round(in_place_cost_s, 3),
                "rescales_sim": sum(1 for e in sim.result.events if e.kind.value == "in_place"),
                "rescales_real": len(in_place),
                "min_job_run_s": round(min(running), 1),
                "real_wall_s": round(real.wall_s, 1),
                "refit_iter_s": {j: dict(zip(map(str, p.batch_sizes), (round(t, 4) for t in p.iter_times_s))) for j, p in sorted(refitted.items())},
                "step_time_per_generation": step_gaps(real.job_results, lambda j: refitted.get(j, profile)),
            }
        )
    return runs


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="virtual GPU workers (2 = one per core on the 2-core dev box)")
    ap.add_argument("--model", default="resnet_small")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--samples", type=int, nargs=3, default=None, help=f"per job (default {SAMPLES}; with --refit {REFIT_SAMPLES}: each job >= 2 min on the 2-core box)")
    ap.add_argument("--arrivals", type=float, nargs=3, default=[0.0, 8.0, 16.0])
    ap.add_argument("--in-place-cost", type=float, default=0.05, help="simulator's seconds lost per in-place rescale (measured pause of a small model on CPU: 0.02-0.05 s); --refit uses the run's own median pause when it rescaled")
    ap.add_argument("--profile-on-worker", action="store_true", help="re-measure the profile's iteration times with the profiler running on a Dask worker")
    ap.add_argument("--calibrate", action="store_true", help="replace the profiler's iteration times by the trainer's own step times, one job on every worker at once (the load the jobs will see), and charge its measured fixed per-job cost as the start cost")
    ap.add_argument("--refit", action="store_true", help="real run first; simulate each job on the model refitted from its own steps, with the run's measured fixed per-job cost")
    ap.add_argument("--runs", type=int, default=1, help="--refit: repeat real run, refit and simulation this many times")
    args = ap.parse_args()
    if args.samples is None:
        args.samples = REFIT_SAMPLES if args.refit else SAMPLES
    if args.runs < 1 or (args.runs > 1 and not args.refit):
        ap.error("--runs: a positive count, and only with --refit")

    from flows.commands.shared.console import library_environment

    # The CLI's own Prefect settings (telemetry off, 120 s for the temporary server to start:
    # a first start on a fresh Prefect home migrates its database and took > 20 s here).
    for name, value in library_environment(verbose=True).items():
        os.environ.setdefault(name, value)
    state = Path(tempfile.mkdtemp(prefix="sim-vs-real-"))
    os.environ["MALLEABLE_STATE_DIR"] = str(state)
    os.environ["MALLEABLE_EXPERIMENT"] = "sim-vs-real"

    from flows.config.jobfile import load_jobs_file
    from allocator.simulator import RescaleCost
    from allocator.simulator.split import simulated_splits
    from flows.cluster_flow import cluster_flow
    from flows.profile_flow import profile_flow
    from flows.simulate_flow import simulate_flow

    t0 = time.monotonic()
    # Measured anew each run: a profile cached from another hour of this VM is another machine.
    profile = profile_flow(f"elastic_tasks.examples:{args.model}", batch_sizes=[16, 32, 64, 128], repeats=5, warmup=2, refresh=True)
    profile_s = time.monotonic() - t0
    profiled_iter_s = dict(zip(map(str, profile.batch_sizes), (round(t, 4) for t in profile.iter_times_s)))
    start_cost_s, checkpoint_s = 0.0, 0.0
    if args.profile_on_worker:
        profile = profile_on_one_worker(f"elastic_tasks.examples:{args.model}", profile)
        print("profile on a worker, s per batch:", dict(zip(profile.batch_sizes, (round(t, 4) for t in profile.iter_times_s))))
    if args.calibrate:
        measured, start_cost_s, checkpoint_s = calibrate_on_workers(f"elastic_tasks.examples:{args.model}", list(profile.batch_sizes), CALIBRATE_STEPS, state / "calibrate", args.workers)
        print("trainer step s per batch:", dict(zip(profile.batch_sizes, (round(t, 4) for t in measured))), f"fixed per-job cost {start_cost_s:.2f} s, a checkpoint write {checkpoint_s:.3f} s")
        profile = dataclasses.replace(profile, iter_times_s=tuple(max(measured[: i + 1]) for i in range(len(measured))))
    common = {"model": args.model, "workers": args.workers, "samples": args.samples, "arrivals": args.arrivals, "calibrated": args.calibrate,
              "profiled_on_worker": args.profile_on_worker, "profiler_iter_s": profiled_iter_s, "profile_s": round(profile_s, 1)}  # fmt: skip

    if args.refit:
        runs = refit_runs(args, profile, state)
        means = [r["mean_abs_jct_diff_pct"] for r in runs]
        maxes = [r["max_abs_jct_diff_pct"] for r in runs]
        logging.getLogger("prefect").setLevel(logging.WARNING)
        print(
            json.dumps(
                {
                    "mode": "refit",
                    **common,
                    "runs": len(runs),
                    "mean_abs_jct_diff_pct": statistics.median(means),
                    "max_abs_jct_diff_pct": statistics.median(maxes),
                    "mean_abs_jct_diff_pct_runs": means,
                    "max_abs_jct_diff_pct_runs": maxes,
                    "mean_abs_jct_diff_pct_spread": spread(means),
                    "max_abs_jct_diff_pct_spread": spread(maxes),
                    "min_job_run_s": min(r["min_job_run_s"] for r in runs),
                    "per_run": runs,
                }
            )
        )
        return

    jobs_file = state / "jobs.yaml"
    write_jobs_file(jobs_file, args, {args.model: profile})
    every = REAL_CHECKPOINT_EVERY if args.calibrate else 0
    sim = simulate_flow(
        str(jobs_file), gpus=args.workers, interval_s=args.interval, react=True, in_place_cost_s=args.in_place_cost, start_cost_s=start_cost_s,
        run_name="simulated", checkpoint_s=checkpoint_s, checkpoint_every=every,
    )  # fmt: skip
    real = cluster_flow(str(jobs_file), workers=args.workers, interval_s=args.interval, react=True, run_name="real")
    sim_jct, real_jct, diff = compare_jcts(sim, real)
    sim_cost = RescaleCost(in_place_s=args.in_place_cost, start_s=start_cost_s, checkpoint_s=checkpoint_s, checkpoint_every=every)
    splits = print_splits(real.wall_splits, simulated_splits(sim.result, {j.id: j for j in load_jobs_file(jobs_file).jobs}, sim_cost))
    step_gap = step_gaps(real.job_results, lambda j: profile)
    in_place = [e.cost_s for e in real.result.events if e.kind.value == "in_place" and e.cost_s is not None]
    # Prefect's ephemeral server says goodbye at exit; keep the JSON the last line of output.
    logging.getLogger("prefect").setLevel(logging.WARNING)
    print(
        json.dumps(
            {
                **common,
                "sim_iter_s": dict(zip(map(str, profile.batch_sizes), (round(t, 4) for t in profile.iter_times_s))),
                "sim_start_cost_s": round(start_cost_s, 2),
                "sim_checkpoint_s": round(checkpoint_s, 4),
                "sim_checkpoint_every": every,
                "sim_in_place_cost_s": args.in_place_cost,
                "jct_sim_s": {j: round(v, 2) for j, v in sorted(sim_jct.items())},
                "jct_real_s": {j: round(v, 2) for j, v in sorted(real_jct.items())},
                "jct_diff_pct": {j: round(v, 1) for j, v in sorted(diff.items())},
                "max_abs_jct_diff_pct": round(max(abs(v) for v in diff.values()), 1),
                "mean_abs_jct_diff_pct": round(statistics.mean(abs(v) for v in diff.values()), 1),
                "avg_jct_sim_s": round(statistics.mean(sim_jct.values()), 2),
                "avg_jct_real_s": round(statistics.mean(real_jct.values()), 2),
                "rescales_sim": sum(1 for e in sim.result.events if e.kind.value == "in_place"),
                "rescales_real": len(in_place),
                "real_in_place_pause_s_median": round(statistics.median(in_place), 3) if in_place else None,
                "real_wall_s": round(real.wall_s, 1),
                "step_time_per_generation": step_gap,
                "wall_split": splits,
                "unaccounted_wall_pct": round(max((v["unaccounted_pct"] for v in splits.values()), default=float("nan")), 2),
                "min_job_run_s": round(min((r.finish - r.start for r in real.result.jobs if r.start is not None and r.finish is not None), default=0.0), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
