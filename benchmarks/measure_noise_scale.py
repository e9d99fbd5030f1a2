"""Measure gradient-noise-scale trajectories of the repo's examples on CPU; write them as JSON.

Each example trains on one process the way a rank does (the recipe's model, data, optimizer
and LR; the trainer's sample stream and loss scaling), with global batch ``--batch`` split
into ``--micro`` micro-batches, for ``--epochs`` epochs. ``elastic_tasks.rank.noise_scale`` (the
trainer's own estimator, one-rank/accumulation path) measures B_noise every step; the file
keeps the smoothed value at ``--points`` evenly spaced fractions of the run.

The examples stand in for seed 000's categories (``CATEGORY_EXAMPLES``): resnet for
ResNet-50, alexnet for AlexNet, vgg for VGG-11-BN; category 4 (AlexNet on Food-101) is
alexnet on its own data seed. What carries over to the simulated jobs is the *shape* of
B_noise over the fraction of training done, measured here on short synthetic-data runs.

Run: python benchmarks/measure_noise_scale.py   (writes benchmarks/data/noise_trajectories.json)
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from elastic_tasks.examples import recipes
from elastic_tasks.rank.noise_scale import GradientNoiseProbe
from elastic_tasks.recipe import TrainingRecipe, collate
from elastic_tasks.rank.sharding import EpochSampler

OUT = Path(__file__).resolve().parent / "data" / "noise_trajectories.json"

CATEGORY_EXAMPLES = {
    "resnet50-cifar100": ("resnet_small", recipes.resnet_small),
    "alexnet-cifar100": ("alexnet_small", recipes.alexnet_small),
    "vgg11_bn-cifar100": ("vgg_small", recipes.vgg_small),
    "alexnet-food101": ("alexnet_small seed 1", partial(recipes.image_recipe, "alexnet_small_seed1",
                                                        partial(recipes.AlexNetish, width=8, fc_width=128, num_classes=10),
                                                        seed=1, base_lr=0.01)),
}


def measure(recipe: TrainingRecipe, batch: int, micro: int, epochs: float, points: int, seed: int = 0) -> dict[str, object]:
    torch.manual_seed(seed)
    model = recipe.build_model()
    lr = recipe.base_lr * batch / recipe.base_batch  # the trainer's linear-scaling LR
    optimizer = recipe.make_optimizer(model.parameters(), lr)
    sampler = EpochSampler(len(recipe.dataset), seed)  # type: ignore[arg-type]
    probe = GradientNoiseProbe(smoothing=0.95)
    steps = int(epochs * len(recipe.dataset) / batch)  # type: ignore[arg-type]
    marks = {int(round(f * (steps - 1))): f for f in np.linspace(1 / points, 1.0, points)}
    series, losses = [], []
    t0 = time.perf_counter()
    for step in range(steps):
        idx = sampler.step_indices(step * batch, batch)
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for a in range(0, batch, micro):
            x, y = collate(recipe.dataset, idx[a : a + micro])
            n = len(y)
            loss = recipe.loss_fn(model(x), y)
            (loss * (n / batch)).backward()
            probe.after_micro(model, n, 1 / batch, world=1)
            loss_sum += float(loss.detach()) * n
        value = probe.finish_step(model, batch, world=1)
        optimizer.step()
        losses.append(loss_sum / batch)
        if step in marks:
            series.append((round(marks[step], 4), value, float(np.mean(losses[-20:]))))
    return {
        "batch": batch,
        "micro_batch": micro,
        "steps": steps,
        "seconds": round(time.perf_counter() - t0, 1),
        "fractions": [f for f, _, _ in series],
        "noise_scale": [round(v, 2) for _, v, _ in series],
        "loss": [round(v, 4) for _, _, v in series],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--points", type=int, default=10)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {
        "source": "benchmarks/measure_noise_scale.py " + f"--batch {args.batch} --micro {args.micro} --epochs {args.epochs} --points {args.points}",
        "estimator": "elastic_tasks.rank.noise_scale.GradientNoiseProbe (one rank, accumulation micro-batches), EMA 0.95",
        "workloads": {},
    }
    for workload, (example, factory) in CATEGORY_EXAMPLES.items():
        measured = measure(factory(), args.batch, args.micro, args.epochs, args.points)
        result["workloads"][workload] = {"example": example, **measured}
        print(workload, example, measured["noise_scale"], measured["loss"], f"{measured['seconds']} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
