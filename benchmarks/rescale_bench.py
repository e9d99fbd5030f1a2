"""In-place rescale vs checkpoint-restart, and the elastic trainer's steady-state overhead.

One run, one 3-worker Dask LocalCluster (1 thread per worker, gloo on CPU), one ~10M
parameter model (``alexnet_10m``: 9.7M parameters, SGD with momentum, so a new rank must
receive ~77 MB of parameters and momentum), global batch 32:

* in place: a job scales 2 -> 3 -> 2 repeatedly; per event, the pause the ranks measure
  (end of the last old-generation step -> new generation ready: regroup + state copy).
  New ranks build their model while the job keeps training; that time is reported apart.
* restart: the same job scales 2 -> 3 through a checkpoint: save, stop every rank,
  restart the worker processes, start new ranks that load the checkpoint (the full cost,
  ``restart_rescale_s``); then 3 -> 2 restarting only the rank tasks on the same warm
  processes (a lower bound, ``restart_tasks_only_s``). The pause is measured the same way
  (last step before the stop -> new generation ready).
* steady overhead: median step time of the elastic trainer at a fixed 2 ranks vs a plain
  DDP loop (same model, data, batch and workers), in rounds that sandwich the elastic runs
  between two plain runs (their mean is the round's baseline, cancelling a linear drift of the
  machine's load); the figure is the median of the per-round ratios (min and max printed too). On a
  shared machine the wall ratio is noisy, so two steadier figures come with it: the ratio of
  CPU time per step of rank 0's whole process (all threads, so the elastic trainer's
  background courier counts), and the time of the trainer's own collective (the end-of-step
  agreement) as a share of the step. Each round runs the elastic trainer twice, with the
  gradient-noise probe on (what users run: ``steady_*``) and off (``*_no_probe``), so the
  probe's own share (``probe_cpu_share_pct``: CPU time per step, on vs off) comes from the same run.
* ``noise_scale_rel_error``: on the example ``mlp_tiny`` (one rank, accumulation 4), the
  trainer's cheap probe (fused float32 norms, first micro-batch, sampled every N steps; N from
  the variance; ``*_budgeted``: with the trainer's default 1 % cost budget as well)
  against the reference every-step float64 estimator (every micro-batch's gradient), fed the
  same gradients; the relative difference of their smoothed estimates averaged over the
  second half of the run (trace and |G|^2 averaged apart, then divided).

Usage: ``python benchmarks/rescale_bench.py [--events 3] [--steady-steps 25]``.
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import timedelta

from distributed import Client

from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import WorkerPool, warm_up, worker_info
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.protocol import TrainConfig

ENTRY = "elastic_tasks.examples.recipes:alexnet_10m"
BATCH = 32


def plain_ddp(rank: int, world: int, host: str, port: int, steps: int) -> tuple[list[float], list[float]]:
    """A textbook DDP loop: same model, data and batch; returns per-step wall and process CPU times."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from elastic_tasks.recipe import collate, load_entry_point

    torch.set_num_threads(1)
    recipe = load_entry_point(ENTRY)
    store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(recipe.build_model())
        opt = recipe.make_optimizer(model.parameters(), recipe.base_lr * BATCH / recipe.base_batch)
        perm = torch.randperm(len(recipe.dataset), generator=torch.Generator().manual_seed(0))
        local = BATCH // world
        times, cpu = [], []
        for step in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            start = (step * BATCH + rank * local) % (len(perm) - BATCH)
            x, y = collate(recipe.dataset, perm[start : start + local])
            opt.zero_grad(set_to_none=True)
            loss = recipe.loss_fn(model(x), y)
            loss.backward()
            opt.step()
            float(loss.detach())
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        return times, cpu
    finally:
        dist.destroy_process_group()


def run_plain(client: Client, workers: list[str], steps: int, port: int) -> tuple[float, float]:
    host = "127.0.0.1"
    futures = [
        client.submit(plain_ddp, r, len(workers), host, port, steps, workers=[w], allow_other_workers=False, pure=False)
        for r, w in enumerate(workers)
    ]
    times, cpu = futures[0].result()
    for f in futures[1:]:
        f.result()
    return statistics.median(times[3:]), statistics.median(cpu[3:])


def run_elastic_steady(client: Client, steps: int, tag: str, probe: bool = True) -> tuple[float, float, float]:
    """Median step wall time, step CPU time and end-of-step agreement time (the trainer's own collectives)."""
    config = TrainConfig(global_batch=BATCH, max_steps=steps, timeout_s=60, evaluate=False, noise_probe=probe)
    job = JobCoordinator(client, WorkerPool(client), f"steady-{tag}-{'probe' if probe else 'off'}", ENTRY, config)
    job.start(2)
    result = job.wait(600)
    steady = result.history[3:]
    return (
        statistics.median(h.wall_s for h in steady),
        statistics.median(h.cpu_s for h in steady),
        statistics.median(h.agree_s for h in steady),
    )


def noise_scale_rel_error(steps: int = 400, batch: int = 64, micro: int = 16, budget: float | None = 0.01) -> tuple[float, float, float, int]:
    """The cheap probe vs the every-step float64 reference on the same gradients (see the docstring)."""
    import torch

    from elastic_tasks.rank.noise.probe_schedule import SampleSchedule
    from elastic_tasks.rank.noise.scale import GradientNoiseProbe, NoiseScaleEstimator, noise_terms
    from elastic_tasks.recipe import load_entry_point, to_device
    from elastic_tasks.rank.data.sharding import EpochSampler

    recipe = load_entry_point("elastic_tasks.examples.recipes:mlp_tiny")
    torch.manual_seed(0)
    model = recipe.build_model()
    opt = recipe.make_optimizer(model.parameters(), recipe.base_lr * batch / recipe.base_batch)
    sampler = EpochSampler(len(recipe.dataset), 0)
    # The probe as the trainer runs it (its cost budget included), on a clock that leaves out
    # the reference's float64 bookkeeping: the budget sees the step the trainer would run.
    reference_s = [0.0]
    schedule = SampleSchedule(cost_budget=budget)
    probe, reference = GradientNoiseProbe(schedule=schedule, clock=lambda: time.perf_counter() - reference_s[0]), NoiseScaleEstimator()
    cheap_values, ref_values = [], []

    def sq64(tensors: list[torch.Tensor]) -> float:
        return float(sum(t.double().pow(2).sum() for t in tensors))

    for step in range(steps):
        indices = sampler.step_indices(step * batch, batch)
        opt.zero_grad(set_to_none=True)
        probe.begin_step(model, world=1, micro_batches=batch // micro)
        previous, micro_sq = None, []
        for a in range(0, batch, micro):
            chunk = [recipe.dataset[int(i)] for i in indices[a : a + micro]]
            loss, _ = recipe.loss(model, to_device(recipe.collate(chunk), torch.device("cpu")))
            (loss * (len(chunk) / batch)).backward()
            probe.after_micro(model, len(chunk), 1 / batch, world=1)
            t_ref = time.perf_counter()
            grads = [p.grad.double() for p in model.parameters() if p.grad is not None]
            diff = grads if previous is None else [g - p for g, p in zip(grads, previous)]
            micro_sq.append(sq64(diff) / (len(chunk) / batch) ** 2)  # the micro-batch's mean gradient
            previous = [g.clone() for g in grads]
            reference_s[0] += time.perf_counter() - t_ref
        t_ref = time.perf_counter()
        big = sq64([p.grad for p in model.parameters() if p.grad is not None])
        reference.update(noise_terms(sum(micro_sq) / len(micro_sq), micro, big, batch))
        reference_s[0] += time.perf_counter() - t_ref
        cheap = probe.finish_step(model, batch, world=1)
        opt.step()
        if step >= steps // 2 and probe.estimator.grad_sq is not None:
            # Numerator and denominator averaged apart, then divided (McCandlish et al.'s advice).
            cheap_values.append((probe.estimator.trace, probe.estimator.grad_sq))
            ref_values.append((reference.trace, reference.grad_sq))
    del cheap
    cheap_mean = statistics.mean(t for t, _ in cheap_values) / statistics.mean(g for _, g in cheap_values)
    ref_mean = statistics.mean(t for t, _ in ref_values) / statistics.mean(g for _, g in ref_values)
    return abs(cheap_mean - ref_mean) / abs(ref_mean), cheap_mean, ref_mean, probe.schedule.every


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=3, help="in-place scale-outs (and as many scale-ins)")
    parser.add_argument("--steady-steps", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=4, help="A/B rounds of the steady-state comparison")
    args = parser.parse_args()

    t_start = time.time()
    with local_gpu_cluster(3) as cluster, Client(cluster) as client, tempfile.TemporaryDirectory() as ckpt:
        warm_up(client, ENTRY)
        print(f"cluster ready in {time.time() - t_start:.1f} s")

        # Steady state first (A/B/A/B), on two workers, nothing else running.
        workers = sorted(worker_info(client))[:2]
        # Other load on the machine drifts over minutes: each round sandwiches the two elastic
        # runs between two plain runs (plain, elastic, elastic, plain) and compares them with the
        # plain runs' mean, which cancels a drift that is linear over the round; the probe's on
        # and off runs alternate their order; the figure is the median over rounds.
        plain, elastic, ratios, agree, cpu_ratios = [], [], [], [], []
        off_ratios, off_cpu_ratios, probe_cpu = [], [], []
        for i in range(args.rounds):
            before = run_plain(client, workers, args.steady_steps, 29500 + 2 * i)
            order = (True, False) if i % 2 == 0 else (False, True)
            runs = {probe: run_elastic_steady(client, args.steady_steps, str(i), probe) for probe in order}
            after = run_plain(client, workers, args.steady_steps, 29501 + 2 * i)
            plain_wall, plain_cpu = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
            (step_s, cpu_s, agree_s), (off_s, off_cpu, _) = runs[True], runs[False]
            plain.append(plain_wall)
            elastic.append(step_s)
            agree.append(agree_s)
            ratios.append(step_s / plain_wall)
            cpu_ratios.append(cpu_s / plain_cpu)
            off_ratios.append(off_s / plain_wall)
            off_cpu_ratios.append(off_cpu / plain_cpu)
            probe_cpu.append(cpu_s / off_cpu)
            print(
                f"steady round {i}: plain DDP {before[0]:.4f}/{after[0]:.4f} s/step ({before[1]:.4f}/{after[1]:.4f} CPU), "
                f"elastic probe on {step_s:.4f} s/step ({cpu_s:.4f} CPU), probe off {off_s:.4f} s/step ({off_cpu:.4f} CPU); "
                f"wall ratio on {ratios[-1]:.4f} off {off_ratios[-1]:.4f}, CPU ratio on {cpu_ratios[-1]:.4f} off {off_cpu_ratios[-1]:.4f}"
            )
        plain_s, elastic_s = statistics.median(plain), statistics.median(elastic)
        # The estimator itself (cheap norms, the variance's N), and as the trainer runs it by
        # default (its 1 % cost budget may thin samples beyond what the variance asks on CPU).
        rel_error, cheap_noise, ref_noise, every = noise_scale_rel_error(budget=None)
        rel_budgeted, budgeted_noise, _, every_budgeted = noise_scale_rel_error(budget=0.01)
        print(
            f"noise scale on mlp_tiny: cheap probe {cheap_noise:.2f} (every {every} steps at the end), "
            f"with the 1 % budget {budgeted_noise:.2f} (every {every_budgeted}), every-step float64 {ref_noise:.2f}"
        )

        config = TrainConfig(global_batch=BATCH, max_steps=100_000, timeout_s=60, checkpoint_dir=ckpt, evaluate=False)
        job = JobCoordinator(client, WorkerPool(client), "rescale", ENTRY, config)
        job.start(2)
        outs, ins, prepare = [], [], []
        for i in range(args.events):
            for gpus, sink in ((3, outs), (2, ins)):
                status = job.status()
                at = (status.step if status else 0) + 3
                outcome = job.rescale(gpus, at_step=at)
                sink.append(outcome.pause_s)
                if gpus == 3:
                    prepare.append(outcome.prepare_s)
                print(f"in place {outcome.before}->{outcome.after} at step {outcome.step}: pause {outcome.pause_s:.3f} s")
        # Restart path, 2 -> 3 with fresh worker processes (the full cost), then 3 -> 2 restarting
        # only the rank tasks on the same processes (a lower bound: no process start, no imports).
        status = job.status()
        full = job.restart_rescale(3, at_step=(status.step if status else 0) + 2, restart_processes=True)
        print(f"restart (processes) {full.before}->{full.after} at step {full.step}: pause {full.pause_s:.3f} s")
        status = job.status()
        tasks = job.restart_rescale(2, at_step=(status.step if status else 0) + 2, restart_processes=False)
        print(f"restart (tasks only) {tasks.before}->{tasks.after} at step {tasks.step}: pause {tasks.pause_s:.3f} s")
        job.stop()
        job.wait(120)

    inplace_out = statistics.median(outs)
    inplace_in = statistics.median(ins)
    figures = {
        "model": "alexnet_10m",
        "params": 9_672_202,
        "backend": "gloo",
        "global_batch": BATCH,
        "inplace_scale_out_s": round(inplace_out, 4),
        "inplace_scale_in_s": round(inplace_in, 4),
        "inplace_events": len(outs) + len(ins),
        "new_rank_prepare_s": round(statistics.median(prepare), 3),
        "restart_rescale_s": round(full.pause_s, 3),
        "restart_tasks_only_s": round(tasks.pause_s, 3),
        "speedup_vs_restart": round(full.pause_s / statistics.median(outs + ins), 1),
        "speedup_vs_task_restart": round(tasks.pause_s / statistics.median(outs + ins), 1),
        "plain_ddp_step_s": round(plain_s, 4),
        "elastic_step_s": round(elastic_s, 4),
        "steady_overhead_pct": round(100 * (statistics.median(ratios) - 1), 2),
        "steady_ratio_min": round(min(ratios), 4),
        "steady_ratio_max": round(max(ratios), 4),
        "steady_rounds": len(ratios),
        "steady_cpu_overhead_pct": round(100 * (statistics.median(cpu_ratios) - 1), 2),
        "steady_cpu_ratio_min": round(min(cpu_ratios), 4),
        "steady_cpu_ratio_max": round(max(cpu_ratios), 4),
        "steady_overhead_no_probe_pct": round(100 * (statistics.median(off_ratios) - 1), 2),
        "steady_cpu_overhead_no_probe_pct": round(100 * (statistics.median(off_cpu_ratios) - 1), 2),
        "probe_cpu_share_pct": round(100 * (statistics.median(probe_cpu) - 1), 2),
        "noise_scale_rel_error": round(rel_error, 4),
        "noise_scale_rel_error_budgeted": round(rel_budgeted, 4),
        "noise_probe_every_mlp_tiny": every,
        "noise_probe_every_mlp_tiny_budgeted": every_budgeted,
        "agree_s": round(statistics.median(agree), 5),
        "agree_pct_of_step": round(100 * statistics.median(agree) / elastic_s, 3),
        "wall_s": round(time.time() - t_start, 1),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
