"""Built-in example workloads: small CNNs shaped like seed 000's models on a learnable synthetic task.

Entry points (``malleable profile elastic_tasks.examples:resnet_small``, ``malleable train ...``):
``mlp_tiny``, ``resnet_small``, ``alexnet_small``, ``vgg_small``, ``resnet_10m``,
``alexnet_10m``, ``vgg_10m``.
"""

from elastic_tasks.examples.data import SyntheticClassification, SyntheticSpec
from elastic_tasks.examples.models import MLP, AlexNetish, ResNetish, VGGish, count_params
from elastic_tasks.examples.recipes import (
    EXAMPLES,
    alexnet_10m,
    alexnet_small,
    image_recipe,
    mlp_tiny,
    resnet_10m,
    resnet_small,
    sgd_momentum,
    vgg_10m,
    vgg_small,
)

__all__ = [
    "EXAMPLES",
    "MLP",
    "AlexNetish",
    "ResNetish",
    "SyntheticClassification",
    "SyntheticSpec",
    "VGGish",
    "alexnet_10m",
    "alexnet_small",
    "count_params",
    "image_recipe",
    "mlp_tiny",
    "resnet_10m",
    "resnet_small",
    "sgd_momentum",
    "vgg_10m",
    "vgg_small",
]
