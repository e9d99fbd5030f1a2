"""Measure gradient-noise-scale trajectories of the repo's examples on CPU; write them as JSON.

Each example is measured by the product's ``elastic_tasks.profiling.noise_trajectory`` (what
``malleable profile --noise`` runs): one process trains it the way a rank does, with global
batch ``--batch`` split into ``--micro`` micro-batches, for ``--epochs`` epochs; the trainer's
own estimator measures B_noise every step; the file keeps the smoothed value at ``--points``
evenly spaced fractions of the run.

The examples stand in for seed 000's categories (``CATEGORY_EXAMPLES``): resnet for
ResNet-50, alexnet for AlexNet, vgg for VGG-11-BN; category 4 (AlexNet on Food-101) is
alexnet on its own data seed. What carries over to the simulated jobs is the *shape* of
B_noise over the fraction of training done, measured here on short synthetic-data runs.

Run: python benchmarks/measure_noise_scale.py   (writes benchmarks/data/noise_trajectories.json)
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from elastic_tasks.examples import recipes
from elastic_tasks.profiling.noise_trajectory import measure_noise_trajectory
from elastic_tasks.recipe import TrainingRecipe

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
    """The product's measurement (``malleable profile --noise``), in this file's format."""
    m = measure_noise_trajectory(recipe, batch, micro, epochs, points, seed)
    return {
        "batch": m.batch,
        "micro_batch": m.micro_batch,
        "steps": m.steps,
        "seconds": round(m.seconds, 1),
        "fractions": [round(f, 4) for f in m.fractions],
        "noise_scale": [round(v, 2) for v in m.noise_scale],
        "loss": [round(v, 4) for v in m.loss],
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
        "estimator": "elastic_tasks.rank.noise.scale.GradientNoiseProbe (one rank, accumulation micro-batches), EMA 0.95",
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
