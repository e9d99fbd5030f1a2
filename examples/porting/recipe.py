"""The loop of plain_loop.py as a recipe: ``malleable train recipe:recipe`` from this directory."""

import math
from functools import partial

import torch
import torch.nn.functional as F

from elastic_tasks.recipe import LoaderOptions, TrainingRecipe
from plain_loop import Rows, build_model  # the dataset and model stay as they were

STEPS, BATCH = 200, 64


def step_fn(model, batch):
    return F.cross_entropy(model(batch["features"]), batch["label"])


def adamw(params, lr):
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)


def cosine(samples_seen, total):
    return 0.5 * (1 + math.cos(math.pi * min(1.0, samples_seen / total)))


def recipe():
    return TrainingRecipe(
        name="rows", build_model=build_model, dataset=Rows(), loss_fn=None, make_optimizer=adamw,
        base_lr=1e-3, base_batch=BATCH, step_fn=step_fn, precision="bf16", clip_grad_norm=1.0,
        lr_schedule=partial(cosine, total=STEPS * BATCH), loader=LoaderOptions(num_workers=2),
    )
