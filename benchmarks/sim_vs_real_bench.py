"""Simulated vs real: one jobs file through the ``simulate`` flow and the ``cluster`` flow.

The model is profiled on this machine first (the profile flow, one torch thread per worker as
the trainer's ranks use), the jobs file is written with that profile, then the same file runs
(1) through the loop with the modelled executor and (2) for real: gloo ranks on Dask workers,
the same policy, Δ and admission. Printed: per-job JCTs side by side and their difference;
the last line is one JSON object.

    .venv/bin/python benchmarks/sim_vs_real_bench.py [--workers 2] [--model resnet_small] [--calibrate]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml


def trainer_step_times(entrypoint: str, batches: list[int], steps: int) -> list[float]:
    """Median step time of the elastic trainer itself on one worker, per per-GPU batch.

    The profiler times forward+backward+optimizer on a ready batch; a rank's step also fetches
    its samples, runs the per-step agreement collective and reports progress. This measures
    the step the jobs will really take, with the same code, on one worker of the same kind.
    """
    from distributed import Client

    from deploy.clusters import connect
    from elastic_tasks.cluster import WorkerPool, warm_up
    from elastic_tasks.coordinator import JobCoordinator
    from elastic_tasks.protocol import TrainConfig

    out = []
    with connect("local", workers=1) as client:
        assert isinstance(client, Client)
        warm_up(client, entrypoint)
        for b in batches:
            job = JobCoordinator(client, WorkerPool(client), f"calibrate-{b}", entrypoint, TrainConfig(global_batch=b, max_steps=steps, evaluate=False))
            job.start(1, b)
            result = job.wait(timeout=300)
            out.append(statistics.median(r.step_time_s for r in result.ranks if r.step_time_s > 0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="virtual GPU workers (2 = one per core on the 2-core dev box)")
    ap.add_argument("--model", default="resnet_small")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--samples", type=int, nargs=3, default=[16384, 8192, 8192])
    ap.add_argument("--arrivals", type=float, nargs=3, default=[0.0, 8.0, 16.0])
    ap.add_argument("--in-place-cost", type=float, default=1.0, help="simulator's seconds lost per in-place rescale")
    ap.add_argument("--calibrate", action="store_true", help="replace the profiler's iteration times by the trainer's own step times on one worker")
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
    profile = profile_flow(f"elastic_tasks.examples:{args.model}", batch_sizes=[16, 32, 64, 128], repeats=5, warmup=2)
    profile_s = time.monotonic() - t0
    profiled_iter_s = dict(zip(map(str, profile.batch_sizes), (round(t, 4) for t in profile.iter_times_s)))
    if args.calibrate:
        import dataclasses

        measured = trainer_step_times(f"elastic_tasks.examples:{args.model}", list(profile.batch_sizes), steps=20)
        print("trainer step s per batch:", dict(zip(profile.batch_sizes, (round(t, 4) for t in measured))))
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

    sim = simulate_flow(str(jobs_file), gpus=args.workers, interval_s=args.interval, react=True, in_place_cost_s=args.in_place_cost, run_name="simulated")
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

    step_gap = {}
    for j, r in sorted(real.job_results.items()):
        last = [rank for rank in r.ranks if rank.step_time_s > 0]
        if not last or not r.history:
            continue
        final = r.history[-1]
        per_gpu = -(-final.global_batch // final.world_size)
        modelled = t_proc(profile, per_gpu) + t_comm(profile.allreduce, profile.num_params, final.world_size)
        measured = statistics.median(rank.step_time_s for rank in last)
        step_gap[j] = {"gpus": final.world_size, "batch": final.global_batch, "measured_step_s": round(measured, 4), "modelled_step_s": round(modelled, 4)}
        print(f"{j}: last generation {final.world_size} GPUs x batch {final.global_batch}: step {measured * 1000:.1f} ms measured vs {modelled * 1000:.1f} ms modelled")
    in_place = [e.cost_s for e in real.result.events if e.kind.value == "in_place"]
    print(
        json.dumps(
            {
                "model": args.model,
                "workers": args.workers,
                "calibrated": args.calibrate,
                "profiler_iter_s": profiled_iter_s,
                "sim_iter_s": dict(zip(map(str, profile.batch_sizes), (round(t, 4) for t in profile.iter_times_s))),
                "profile_s": round(profile_s, 1),
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
                "step_time_last_generation": step_gap,
            }
        )
    )


if __name__ == "__main__":
    main()
