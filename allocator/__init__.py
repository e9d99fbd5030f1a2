"""allocator: pure decisions — types, the throughput and goodput model, policies, the loop, the simulator.

Scripts should import from ``malleable.api`` (the names that stay). Modules of this package that
moved still import under their old names, with a DeprecationWarning naming the new one
(``MOVED``): a script written against an earlier release keeps running while it is updated.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
import warnings

# Old module -> where it lives now (each move kept for at least one release after it was made).
MOVED = {
    "allocator.throughput": "allocator.physics.throughput",
    "allocator.goodput": "allocator.physics.goodput",
    "allocator.noise": "allocator.physics.noise",
    "allocator.topology": "allocator.physics.topology",
    "allocator.profile_io": "allocator.profiles.io",
    "allocator.profile_types": "allocator.profiles.types",
    "allocator.measured": "allocator.profiles.measured",
    "allocator.measured_types": "allocator.profiles.measured_types",
    "allocator.refit": "allocator.profiles.refit",
    "allocator.loop_run": "allocator.loop.run",
    "allocator.loop_types": "allocator.loop.types",
    "allocator.execution": "allocator.loop.execution",
    "allocator.lifecycle": "allocator.loop.lifecycle",
    "allocator.sources": "allocator.loop.sources",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module name with a module that forwards every attribute to the new one (the
    very same objects), after a DeprecationWarning."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self) if name in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there, or from malleable.api", DeprecationWarning, stacklevel=3)
        target = importlib.import_module(new)
        module = ModuleType(spec.name, f"Moved: {new}.")
        module.__getattr__ = lambda attr: getattr(target, attr)  # type: ignore[method-assign]
        module.__all__ = list(getattr(target, "__all__", [n for n in vars(target) if not n.startswith("_")]))  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: ModuleType) -> None:
        return None


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.append(_Moved())
