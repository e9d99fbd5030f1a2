"""The trust boundary for what a submitter may make the service run (docs/service.md).

Anyone who can write the job store can name an entry point; the service imports it on every
GPU worker. ``MALLEABLE_ALLOWED_ENTRYPOINTS`` (comma-separated fnmatch patterns over the
entry point's *module*) limits that: a submission outside it is refused at ``submit`` and, for
a store written by other means, failed by the service before it is admitted. Unset: any module
(the behaviour before the setting; ``serve`` warns when the store is not a local file).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from fnmatch import fnmatchcase

# A built-in example's name ("mlp_tiny") runs from this module.
EXAMPLES_MODULE = "elastic_tasks.examples"


def entry_module(workload: str) -> str:
    return workload.split(":", 1)[0] if ":" in workload else EXAMPLES_MODULE


def parse_patterns(setting: str | None) -> tuple[str, ...] | None:
    """The setting as patterns; None when unset (anything goes)."""
    if setting is None or not setting.strip():
        return None
    return tuple(p.strip() for p in setting.split(",") if p.strip())


def not_allowed(workload: str, patterns: tuple[str, ...] | None) -> str | None:
    """Why ``workload`` is outside the allow-list, or None if it may run."""
    if patterns is None:
        return None
    module = entry_module(workload)
    if any(fnmatchcase(module, p) for p in patterns):
        return None
    return f"module {module!r} is not in MALLEABLE_ALLOWED_ENTRYPOINTS={','.join(patterns)!r}"


def not_importable(workload: str) -> str | None:
    """Why the entry point's module cannot be found here (without running it), or None.

    ``find_spec`` imports the parent packages only; the cwd counts as ``malleable run`` does."""
    module = entry_module(workload)
    added = os.getcwd() not in sys.path and "" not in sys.path
    if added:
        sys.path.append(os.getcwd())
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        return f"module {module!r} cannot be found ({type(exc).__name__}: {exc})"
    except Exception as exc:  # noqa: BLE001 - a parent package raising at import is the user's code
        return f"module {module!r}: importing its package raised {type(exc).__name__}: {exc}"
    finally:
        if added:
            sys.path.remove(os.getcwd())
    return None if found is not None else f"no module {module!r} can be imported here"
