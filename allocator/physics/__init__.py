"""How a job progresses: seed 000's throughput model, goodput with the gradient noise scale, hosts
and allreduce cost, and which physics a run is judged on (``choice.py``).

``allocator.physics`` was once the module that is now ``choice.py``: its names still answer here,
with a DeprecationWarning (scripts should import them from ``malleable.api``).
"""

from __future__ import annotations

import importlib
import warnings

_FROM_CHOICE = ("Physics", "SupportsPhysicsCheck", "check_physics", "physics_of")


def __getattr__(name: str) -> object:
    if name in _FROM_CHOICE:
        warnings.warn(f"allocator.physics.{name} moved to allocator.physics.choice.{name}; import it from there, or from malleable.api", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("allocator.physics.choice"), name)
    raise AttributeError(f"module 'allocator.physics' has no attribute {name!r}")
