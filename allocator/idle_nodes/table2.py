"""Seed 003 Table 2: ImageNet training throughput on Summit nodes (6 V100s, 32 samples/GPU).

Samples per second at 1..64 nodes, the paper's measured points; the scaling curves the
replay and the benchmark use (the MILP interpolates linearly between them, as Fig. 4 does).
"""

from __future__ import annotations

from allocator.idle_nodes.model import ScalingCurve

NODES = (1, 2, 4, 8, 16, 32, 64)
_THOUSANDS = {
    "alexnet": (7.1, 13.1, 21.1, 40.5, 74.0, 130.8, 202.1),
    "resnet18": (5.2, 10.6, 20.4, 39.6, 78.0, 144.8, 262.7),
    "mnasnet": (3.2, 6.0, 11.5, 23.1, 43.9, 83.5, 160.5),
    "mobilenets": (3.0, 5.9, 11.4, 22.0, 42.5, 82.3, 155.2),
    "shufflenet": (2.8, 5.3, 10.0, 20.4, 38.9, 74.1, 145.1),
    "vgg16": (1.2, 2.4, 4.7, 9.3, 18.3, 36.2, 70.2),
    "densenet": (1.0, 2.0, 3.8, 7.6, 15.0, 28.8, 57.8),
}
TABLE2: dict[str, ScalingCurve] = {name: ScalingCurve(NODES, tuple(v * 1000.0 for v in vals)) for name, vals in _THOUSANDS.items()}
