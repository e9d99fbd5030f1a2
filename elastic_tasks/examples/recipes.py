"""Entry points for the built-in examples: ``elastic_tasks.examples:<name>`` returns a recipe.

``*_small`` are tiny (tests, demos: seconds on CPU); ``*_10m`` are about ten million
parameters (benchmarks, profiling). ``mlp_tiny`` is the fastest of all. Every piece of a
recipe is a module-level function or a ``functools.partial`` so it pickles to Dask workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from elastic_tasks.examples.data import SyntheticClassification, SyntheticSpec
from elastic_tasks.examples.models import MLP, AlexNetish, ResNetish, VGGish
from elastic_tasks.recipe import TrainingRecipe

IMAGE_SHAPE = (3, 16, 16)
NUM_CLASSES = 10
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4


def sgd_momentum(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def image_recipe(
    name: str,
    build_model: Callable[[], nn.Module],
    *,
    train_size: int = 16_384,
    eval_size: int = 1_024,
    seed: int = 0,
    base_lr: float = 0.05,
    base_batch: int = 32,
) -> TrainingRecipe:
    """A recipe on the synthetic 3x16x16, 10-class task."""
    train = SyntheticClassification(SyntheticSpec(IMAGE_SHAPE, NUM_CLASSES, seed=seed), train_size, "train")
    return TrainingRecipe(
        name=name,
        build_model=build_model,
        dataset=train,
        loss_fn=F.cross_entropy,
        make_optimizer=sgd_momentum,
        base_lr=base_lr,
        base_batch=base_batch,
        eval_dataset=train.other_split("eval", eval_size),
    )


def adam(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr)


def adamw(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)


def mlp_tiny(*, train_size: int = 2_048, eval_size: int = 512, seed: int = 0, optimizer: str = "sgd") -> TrainingRecipe:
    """32 features, 4 classes, ~6.5k parameters: the fastest recipe, for tests."""
    spec = SyntheticSpec((32,), 4, seed=seed)
    train = SyntheticClassification(spec, train_size, "train")
    make_optimizer, base_lr = {"sgd": (sgd_momentum, 0.05), "adam": (adam, 0.002), "adamw": (adamw, 0.002)}[optimizer]
    return TrainingRecipe(
        name="mlp_tiny" if optimizer == "sgd" else f"mlp_tiny_{optimizer}",
        build_model=partial(MLP, in_features=32, hidden=64, num_classes=4),
        dataset=train,
        loss_fn=F.cross_entropy,
        make_optimizer=make_optimizer,
        base_lr=base_lr,
        base_batch=32,
        eval_dataset=train.other_split("eval", eval_size),
    )


def mlp_tiny_adam() -> TrainingRecipe:
    """mlp_tiny with Adam: optimizer state with a ``step`` tensor next to the moments."""
    return mlp_tiny(optimizer="adam")


def mlp_tiny_adamw() -> TrainingRecipe:
    return mlp_tiny(optimizer="adamw")


def resnet_small() -> TrainingRecipe:
    return image_recipe("resnet_small", partial(ResNetish, width=8, num_classes=NUM_CLASSES))


def alexnet_small() -> TrainingRecipe:
    return image_recipe("alexnet_small", partial(AlexNetish, width=8, fc_width=128, num_classes=NUM_CLASSES), base_lr=0.01)


def vgg_small() -> TrainingRecipe:
    return image_recipe("vgg_small", partial(VGGish, width=8, num_classes=NUM_CLASSES))


def resnet_10m() -> TrainingRecipe:
    return image_recipe("resnet_10m", partial(ResNetish, width=60, num_classes=NUM_CLASSES))


def alexnet_10m() -> TrainingRecipe:
    return image_recipe("alexnet_10m", partial(AlexNetish, width=64, fc_width=2048, num_classes=NUM_CLASSES), base_lr=0.01)


def vgg_10m() -> TrainingRecipe:
    return image_recipe("vgg_10m", partial(VGGish, width=90, num_classes=NUM_CLASSES))


EXAMPLES: dict[str, Callable[[], TrainingRecipe]] = {
    "mlp_tiny": mlp_tiny,
    "resnet_small": resnet_small,
    "alexnet_small": alexnet_small,
    "vgg_small": vgg_small,
    "resnet_10m": resnet_10m,
    "alexnet_10m": alexnet_10m,
    "vgg_10m": vgg_10m,
    "mlp_tiny_adam": mlp_tiny_adam,
    "mlp_tiny_adamw": mlp_tiny_adamw,
}
