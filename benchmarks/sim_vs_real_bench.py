"""Simulated vs real: one jobs file through the ``simulate`` flow and the ``cluster`` flow.

The model is profiled on this machine first (the profile flow, one torch thread per worker as
the trainer's ranks use), the jobs file is written with that profile, then the same file runs
(1) through the loop with the modelled executor and (2) for real: gloo ranks on Dask workers,
the same policy, Δ and admission. Printed: per-job JCTs side by side and their difference;
the last line is one JSON object.

    .venv/bin/python benchmarks/sim_vs_real_bench.py [--workers 2] [--model resnet_small] [--profile-on-worker | --calibrate]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml


def calibrate_on_one_worker(entrypoint: str, batches: list[int], steps: int) -> tuple[list[float], float]:
    """The elastic trainer itself on one worker: median step time per per-GPU batch, and the
    fixed seconds a job costs beyond its steps.

    The fixed part is what a job pays once whatever its length — rank launch and rendezvous,
    the final evaluation, noticing the end — measured as the wall time from ``start`` to a
    collected result minus the job's own step times. The simulator charges it as its start cost.
    """
    from distributed import Client

    from deploy.clusters import connect
    from elastic_tasks.cluster import WorkerPool, warm_up
    from elastic_tasks.coordinator import JobCoordinator
    from elastic_tasks.protocol import TrainConfig

    step_s, fixed_s = [], []
    with connect("local", workers=1) as client:
        assert isinstance(client, Client)
        warm_up(client, entrypoint)
        for b in batches:
            job = JobCoordinator(client, WorkerPool(client), f"calibrate-{b}", entrypoint, TrainConfig(global_batch=b, max_steps=steps))
            t0 = time.monotonic()
            job.start(1, b)
            result = job.wait(timeout=300)
            wall = time.monotonic() - t0
            step_s.append(statistics.median(r.step_time_s for r in result.ranks if r.step_time_s > 0))
            fixed_s.append(wall - sum(h.wall_s for h in result.history))
    return step_s, statistics.median(fixed_s)


def profile_on_one_worker(entrypoint: str, profile):
    """The same profiler, run as a task on a Dask worker of the kind the jobs train on (the
    flow measures in its own process, which runs the same code faster than a worker does)."""
    import dataclasses

    from deploy.clusters import connect
    from elastic_tasks.cluster import warm_up
    from elastic_tasks.profile_dask import submit_profile
    from elastic_tasks.profiler import ProfileSettings

    settings = ProfileSettings(batch_sizes=profile.batch_sizes, repeats=5, warmup=2, threads=1)
    with connect("local", workers=1) as client:
        warm_up(client, entrypoint)
        report = submit_profile(client, entrypoint, settings, profile.allreduce).result()
    return dataclasses.replace(profile, iter_times_s=report.profile.iter_times_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="virtual GPU workers (2 = one per core on the 2-core dev box)")
    ap.add_argument("--model", default="resnet_small")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--samples", type=int, nargs=3, default=[16384, 8192, 8192])
    ap.add_argument("--arrivals", type=float, nargs=3, default=[0.0, 8.0, 16.0])
    ap.add_argument("--in-place-cost", type=float, default=0.05, help="simulator's seconds lost per in-place rescale (measured pause of a small model on CPU: 0.02-0.05 s)")
    ap.add_argument("--profile-on-worker", action="store_true", help="re-measure the profile's iteration times with the profiler running on a Dask worker")
    ap.add_argument("--calibrate", action="store_true", help="replace the profiler's iteration times by the trainer's own step times on one worker, and charge its measured fixed per-job cost as the start cost")
    args = ap.parse_args()

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    state = Path(tempfile.mkdtemp(prefix="sim-vs-real-"))
    os.environ["MALLEABLE_STATE_DIR"] = str(state)
    os.environ["MALLEABLE_EXPERIMENT"] = "sim-vs-real"

    from allocator.profile_io import profile_to_dict
    from flows.cluster_flow import cluster_flow
    from flows.profile_flow import profile_flow
    from flows.simulate_flow import simulate_flow

    t0 = time.monotonic()
    # Measured anew each run: a profile cached from another hour of this VM is another machine.
    profile = profile_flow(f"elastic_tasks.examples:{args.model}", batch_sizes=[16, 32, 64, 128], repeats=5, warmup=2, refresh=True)
    profile_s = time.monotonic() - t0
    profiled_iter_s = dict(zip(map(str, profile.batch_sizes), (round(t, 4) for t in profile.iter_times_s)))
    start_cost_s = 0.0
    if args.profile_on_worker:
        profile = profile_on_one_worker(f"elastic_tasks.examples:{args.model}", profile)
        print("profile on a worker, s per batch:", dict(zip(profile.batch_sizes, (round(t, 4) for t in profile.iter_times_s))))
    if args.calibrate:
        import dataclasses

        measured, start_cost_s = calibrate_on_one_worker(f"elastic_tasks.examples:{args.model}", list(profile.batch_sizes), steps=20)
        print("trainer step s per batch:", dict(zip(profile.batch_sizes, (round(t, 4) for t in measured))), f"fixed per-job cost {start_cost_s:.2f} s")
        profile = dataclasses.replace(profile, iter_times_s=tuple(max(measured[: i + 1]) for i in range(len(measured))))
    jobs_file = state / "jobs.yaml"
    jobs_file.write_text(
        yaml.safe_dump(
            {
                "gpus": args.workers,
                "policy": "elastic_dp",
                "profiles": {args.model: profile_to_dict(profile)},
                "jobs": [
                    {"id": f"job-{c}", "workload": args.model, "profile": args.model, "samples": n, "min_batch": 32, "max_batch": 256, "max_gpus": args.workers, "arrival_s": a}
                    for c, n, a in zip("abc", args.samples, args.arrivals)
                ],
            },
            sort_keys=False,
        )
    )

    sim = simulate_flow(str(jobs_file), gpus=args.workers, interval_s=args.interval, react=True, in_place_cost_s=args.in_place_cost, start_cost_s=start_cost_s, run_name="simulated")
    real = cluster_flow(str(jobs_file), workers=args.workers, interval_s=args.interval, react=True, run_name="real")

    sim_jct = {o.job_id: o.jct_s for o in sim.outcomes}
    real_jct = {o.job_id: o.jct_s for o in real.recorded.outcomes}
    diff = {j: 100.0 * (sim_jct[j] - real_jct[j]) / real_jct[j] for j in real_jct if real_jct[j] and sim_jct.get(j)}
    print(f"{'job':8} {'sim JCT s':>10} {'real JCT s':>11} {'diff %':>8}")
    for j in sorted(real_jct):
        print(f"{j:8} {sim_jct[j]:10.1f} {real_jct[j]:11.1f} {diff.get(j, float('nan')):8.1f}")
    real_events = [(round(e.time, 1), e.job_id, e.kind.value, e.after.gpus if e.after else 0, round(e.cost_s, 3)) for e in real.result.events]
    sim_events = [(round(e.time, 1), e.job_id, e.kind.value, e.after.gpus if e.after else 0) for e in sim.result.events]
    print("real events:", real_events)
    print("sim events: ", sim_events)
    from allocator.throughput import t_comm, t_proc

    # Per generation (world size x batch) of each job: the median measured step against the model.
    step_gap: dict[str, list[dict]] = {}
    for j, r in sorted(real.job_results.items()):
        generations: list[list] = []
        for h in r.history:
            if not generations or (generations[-1][0].world_size, generations[-1][0].global_batch) != (h.world_size, h.global_batch):
                generations.append([])
            generations[-1].append(h)
        for gen in generations:
            first = gen[0]
            per_gpu = -(-first.global_batch // first.world_size)
            modelled = t_proc(profile, per_gpu) + t_comm(profile.allreduce, profile.num_params, first.world_size)
            measured = statistics.median(h.wall_s for h in gen)
            step_gap.setdefault(j, []).append({"gpus": first.world_size, "batch": first.global_batch, "steps": len(gen), "measured_step_s": round(measured, 4), "modelled_step_s": round(modelled, 4)})
            print(f"{j}: {len(gen)} steps on {first.world_size} GPUs x batch {first.global_batch}: median step {measured * 1000:.1f} ms measured vs {modelled * 1000:.1f} ms modelled")
    in_place = [e.cost_s for e in real.result.events if e.kind.value == "in_place"]
    # Prefect's ephemeral server says goodbye at exit; keep the JSON the last line of output.
    logging.getLogger("prefect").setLevel(logging.WARNING)
    print(
        json.dumps(
            {
                "model": args.model,
                "workers": args.workers,
                "calibrated": args.calibrate,
                "profiled_on_worker": args.profile_on_worker,
                "profiler_iter_s": profiled_iter_s,
                "sim_iter_s": dict(zip(map(str, profile.batch_sizes), (round(t, 4) for t in profile.iter_times_s))),
                "profile_s": round(profile_s, 1),
                "sim_start_cost_s": round(start_cost_s, 2),
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
            }
        )
    )


if __name__ == "__main__":
    main()
