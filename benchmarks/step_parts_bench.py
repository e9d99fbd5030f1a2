"""What each part of the elastic trainer's step adds to a plain DDP step, in one process.

``rescale_bench`` compares whole jobs (elastic trainer vs a textbook DDP loop on two Dask
workers); when its CPU ratio reads +10 % this asks which part of the step it could be. One
process, one gloo rank (world 1), ``alexnet_10m`` at batch 16, five step variants built side by
side, each with its own model and optimizer:

* ``P``: the plain loop (the recipe's ``collate``, ``loss_fn(model(x), y)``, ``float(loss)``);
* ``L``: P with the trainer's data path (``RankLoader``: the DataLoader over the elastic stream);
* ``R``: P with the trainer's forward (``RecipeStep`` inside DDP: loss and correct count, both
  read once after the step);
* ``H``: P with the trainer's DDP communication hook (``HookWitness`` around ``allreduce_hook``);
* ``LRH``: all three.

Steps interleave variant by variant (the order rotated each cycle) so that every variant sees
the same machine; per cycle each variant's CPU time is divided by P's, and the figure is the
median of those paired ratios with its interquartile range. On the 2-core VM the same step's
CPU time moves ±20 % from one second to the next (steal from other tenants, no hardware
performance counters to count instructions instead), so what this resolves is a part costing
well over 5 %, not 2 %.

Usage: ``PYTHONPATH=. python benchmarks/step_parts_bench.py [--cycles 60]``; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.rank.data.loader import RankLoader
from elastic_tasks.rank.data.sharding import EpochSampler
from elastic_tasks.rank.forward import RecipeStep
from elastic_tasks.rank.health.collective import HookWitness
from elastic_tasks.recipe import collate, load_entry_point, to_device

ENTRY = "elastic_tasks.examples.recipes:alexnet_10m"
BATCH = 16
VARIANTS = ("P", "L", "R", "H", "LRH")


def make_step(recipe, variant: str) -> Callable[[], None]:  # noqa: ANN001 - a TrainingRecipe
    torch.manual_seed(0)
    model = recipe.build_model()
    trainer_forward = "R" in variant
    ddp = DistributedDataParallel(RecipeStep(model, recipe) if trainer_forward else model, init_sync=False)
    if "H" in variant:

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202 - DDP inspects the signature
            return allreduce_hook(dist.group.WORLD, bucket)

        ddp.register_comm_hook(None, HookWitness().wrap(hook))
    opt = recipe.make_optimizer(model.parameters(), 0.01)
    if "L" in variant:
        batches = RankLoader(recipe, EpochSampler(len(recipe.dataset), 0)).start(0, BATCH, 1, 0, 1)
    else:
        perm, span = torch.randperm(len(recipe.dataset)), len(recipe.dataset) - BATCH
        batches = (collate(recipe.dataset, perm[(i * BATCH) % span : (i * BATCH) % span + BATCH]) for i in itertools.count())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        micro = to_device(next(batches), torch.device("cpu"))
        if trainer_forward:
            loss, hits = ddp(micro)
            loss.float().backward()
            opt.step()
            torch.stack([loss.detach().float() * BATCH, hits.detach().float()]).tolist()
        else:
            x, y = micro
            loss = recipe.loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            float(loss.detach())

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rdzv", rank=0, world_size=1)
        try:
            recipe = load_entry_point(ENTRY)
            steps = {v: make_step(recipe, v) for v in VARIANTS}
            for v in VARIANTS:
                for _ in range(3):
                    steps[v]()
            ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
            cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for cycle in range(args.cycles):
                k = cycle % len(VARIANTS)
                took = {}
                for v in VARIANTS[k:] + VARIANTS[:k]:
                    c0 = time.process_time()
                    steps[v]()
                    took[v] = time.process_time() - c0
                for v in VARIANTS:
                    ratios[v].append(took[v] / took["P"])
                    cpu[v].append(took[v])
        finally:
            dist.destroy_process_group()
    figures: dict[str, object] = {"model": "alexnet_10m", "batch": BATCH, "cycles": args.cycles}
    for v in VARIANTS:
        q = statistics.quantiles(ratios[v], n=4)
        print(f"{v:4s} {statistics.median(cpu[v]) * 1e3:7.2f} ms CPU/step, median paired ratio to P {statistics.median(ratios[v]):.4f} (IQR {q[0]:.4f}-{q[2]:.4f})")
        if v != "P":
            figures[f"{v}_cpu_overhead_pct"] = round(100 * (statistics.median(ratios[v]) - 1), 2)
            figures[f"{v}_ratio_iqr"] = [round(q[0], 4), round(q[2], 4)]
    figures["plain_cpu_step_ms"] = round(1e3 * statistics.median(cpu["P"]), 2)
    figures["plain_cpu_step_ms_min_max"] = [round(1e3 * min(cpu["P"]), 2), round(1e3 * max(cpu["P"]), 2)]
    figures["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
