"""Built-in example workloads: small CNNs shaped like seed 000's models on a learnable synthetic task.

Entry points (``malleable profile elastic_tasks.examples:resnet_small``, ``malleable train ...``):
``mlp_tiny`` (``mlp_tiny_adam``, ``mlp_tiny_adamw``), ``resnet_small``, ``alexnet_small``,
``vgg_small``, ``resnet_10m``, ``alexnet_10m``, ``vgg_10m``, and ``tiny_lm`` (a byte-level
transformer LM on the standard library's source: dict batches, AdamW, cosine LR, clipping).
"""

from elastic_tasks.examples.data import SyntheticClassification, SyntheticSpec
from elastic_tasks.examples.models import MLP, AlexNetish, ResNetish, VGGish, count_params
from elastic_tasks.examples.recipes import (
    EXAMPLES,
    alexnet_10m,
    alexnet_small,
    image_recipe,
    mlp_tiny,
    mlp_tiny_adam,
    mlp_tiny_adamw,
    resnet_10m,
    resnet_small,
    sgd_momentum,
    vgg_10m,
    vgg_small,
)
from elastic_tasks.examples.tiny_lm import TinyLM, tiny_lm

__all__ = [
    "EXAMPLES",
    "MLP",
    "AlexNetish",
    "ResNetish",
    "SyntheticClassification",
    "SyntheticSpec",
    "TinyLM",
    "VGGish",
    "alexnet_10m",
    "alexnet_small",
    "count_params",
    "image_recipe",
    "mlp_tiny",
    "mlp_tiny_adam",
    "mlp_tiny_adamw",
    "resnet_10m",
    "resnet_small",
    "sgd_momentum",
    "vgg_10m",
    "tiny_lm",
    "vgg_small",
]
