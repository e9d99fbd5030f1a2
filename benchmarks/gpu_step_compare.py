"""The product's step beside plain DDP's, on the same worker and device, timed by the device.

One Dask worker (one GPU: ``local_gpu_cluster(1)``). Each round runs, one after the other on
that worker, a whole product job (``JobCoordinator``: the rank loop of ``malleable train``,
world size 1, nccl on a GPU) and a plain DDP loop as a tuned user would write it (DataLoader
with the recipe's options, autocast and GradScaler as the precision asks, the loss read every
``LOG_EVERY`` steps only), both on the same timed recipe (``gpu_step_recipes``: a CUDA event
at the start of every forward). The order alternates round by round. Per run: the mean and
median step time over the steps after ``warmup``; per round the ratio product/plain of the
means (the mean counts every periodic cost: reads, reports, checkpoints); the figure is the
median of the rounds' ratios, with their range.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass

import torch

LOG_EVERY = 50  # a tuned plain loop reads its loss this often


@dataclass(frozen=True)
class Loop:
    entry: str
    batch: int
    warmup: int
    steps: int  # timed steps, after warmup
    backend: str  # nccl on a GPU, gloo on CPU
    noise_probe: bool = True
    max_batch_per_gpu: int | None = None  # below batch: gradient accumulation (the probe samples)

    @property
    def total(self) -> int:
        return self.warmup + self.steps + 1  # intervals: one fewer than forwards


def _summary(intervals: list[float], warmup: int) -> dict[str, float]:
    steady = intervals[warmup:]
    if not steady:
        raise RuntimeError(f"no steady steps timed ({len(intervals)} intervals, warm-up {warmup})")
    return {"mean_ms": statistics.fmean(steady), "median_ms": statistics.median(steady), "n": len(steady)}


def plain_ddp(loop: Loop) -> dict[str, object]:
    """Runs inside the Dask worker: a textbook DDP loop at world size 1 on the recipe's data."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    import gpu_step_recipes
    from elastic_tasks.devices import process_group_backend, rank_device
    from elastic_tasks.recipe import build_optimizer, collate_function, load_entry_point

    torch.set_num_threads(1)  # as a rank does (TrainConfig.torch_threads)
    recipe = load_entry_point(loop.entry)
    device = rank_device(loop.backend)
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group(process_group_backend(loop.backend), store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = recipe.build_model().to(device)
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = build_optimizer(recipe, model)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(recipe.precision)
        scaler = torch.amp.GradScaler(device.type) if recipe.precision == "fp16" else None
        opts = recipe.loader
        data = DataLoader(
            recipe.dataset, batch_size=loop.batch, shuffle=True, drop_last=True, collate_fn=collate_function(recipe),
            num_workers=opts.num_workers, pin_memory=opts.pin_memory, prefetch_factor=opts.prefetch_factor,
            persistent_workers=opts.num_workers > 0,
        )
        gpu_step_recipes.timer_reset()
        batches = itertools.chain.from_iterable(itertools.repeat(data))
        loss = torch.zeros(())
        for i in range(loop.total):
            x, y = next(batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = recipe.loss_fn(ddp(x), y)  # type: ignore[misc]
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            if i % LOG_EVERY == 0:
                float(loss.detach())
        final = float(loss.detach())
        return {"intervals_ms": gpu_step_recipes.timer_take(), "final_loss": final}
    finally:
        dist.destroy_process_group()


def product(client, addr: str, loop: Loop) -> dict[str, object]:  # noqa: ANN001 - a distributed.Client
    """One whole product job on the worker ``addr``; its ranks' step intervals read from it after."""
    import gpu_step_recipes
    from elastic_tasks.cluster import WorkerPool
    from elastic_tasks.coordinator.job import JobCoordinator
    from elastic_tasks.protocol import TrainConfig

    config = TrainConfig(
        global_batch=loop.batch, max_steps=loop.total, backend=loop.backend, timeout_s=60.0, evaluate=False,
        noise_probe=loop.noise_probe, max_batch_per_gpu=loop.max_batch_per_gpu,
    )
    client.run(gpu_step_recipes.timer_reset, workers=[addr])
    job = JobCoordinator(client, WorkerPool(client), f"gpu-steps-{time.monotonic_ns()}", loop.entry, config)
    try:
        job.start(1)
        result = job.wait(600)
    finally:
        job.close()
        job.board.forget()
    [intervals] = client.run(gpu_step_recipes.timer_take, workers=[addr]).values()
    losses = [r.loss for r in result.history]
    return {
        "intervals_ms": intervals, "final_loss": losses[-1] if losses else float("nan"), "finished": result.finished,
        "samples_exact": result.samples_seen == loop.total * loop.batch,
    }


def side_by_side(first: Loop, second: Loop, rounds: int, run_first, run_second) -> dict[str, object]:  # noqa: ANN001 - runners: Loop -> outcome
    """``rounds`` rounds of two runs, order alternating; ratio first/second of the mean step time."""
    runs: dict[str, list[dict[str, object]]] = {"a": [], "b": []}
    ratios = []
    for r in range(rounds):
        order = [("a", run_first, first), ("b", run_second, second)]
        for key, run, loop in order if r % 2 == 0 else order[::-1]:
            out = run(loop)
            out.update(_summary(out.pop("intervals_ms"), loop.warmup))  # type: ignore[arg-type]
            runs[key].append(out)
        ratios.append(runs["a"][-1]["mean_ms"] / runs["b"][-1]["mean_ms"])  # type: ignore[operator]
    return {
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "a_mean_ms": statistics.median(x["mean_ms"] for x in runs["a"]),  # type: ignore[misc]
        "b_mean_ms": statistics.median(x["mean_ms"] for x in runs["b"]),  # type: ignore[misc]
        "a_median_ms": statistics.median(x["median_ms"] for x in runs["a"]),  # type: ignore[misc]
        "b_median_ms": statistics.median(x["median_ms"] for x in runs["b"]),  # type: ignore[misc]
        "runs": runs,
    }


def elastic_vs_plain(loops: list[Loop], rounds: int) -> list[dict[str, object]]:
    """The product's step against plain DDP's on one (real or virtual) GPU, for each of ``loops``
    on the same worker: ratio of mean step times."""
    from distributed import Client

    from deploy.local import local_gpu_cluster
    from elastic_tasks.cluster import warm_up

    with local_gpu_cluster(1) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=180)
        warm_up(client, loops[0].entry)
        [addr] = list(client.scheduler_info()["workers"])

        def run_plain(lp: Loop) -> dict[str, object]:
            return client.submit(plain_ddp, lp, workers=[addr], resources={"GPU": 1}, pure=False).result(timeout=600)

        return [side_by_side(loop, loop, rounds, lambda lp: product(client, addr, lp), run_plain) for loop in loops]


def probe_on_off(loop: Loop, rounds: int) -> dict[str, object]:
    """The product with the gradient-noise probe on against off (accumulation, so that it samples)."""
    from dataclasses import replace

    from distributed import Client

    from deploy.local import local_gpu_cluster
    from elastic_tasks.cluster import warm_up

    with local_gpu_cluster(1) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=180)
        warm_up(client, loop.entry)
        [addr] = list(client.scheduler_info()["workers"])
        on, off = replace(loop, noise_probe=True), replace(loop, noise_probe=False)
        return side_by_side(on, off, rounds, lambda lp: product(client, addr, lp), lambda lp: product(client, addr, lp))
