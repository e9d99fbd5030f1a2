"""Which code a job runs: its entry point's module file, by content, loaded fresh when it changed.

Dask workers live as long as the service; Python caches a module once imported. A submitter
who edits ``m.py`` and submits again would train the first version. So:

* ``refresh`` (called by ``recipe.load_entry_point`` on every load) re-executes the entry
  point's module, in place, from the bytes on disk whenever they differ from the bytes this
  process last executed for it. It compiles those exact bytes (never a cached ``.pyc``, whose
  check is by mtime and size and misses an edit within the same second).
* ``code_version`` is the SHA-256 of that file, read without importing it: the service records
  it per job (the store's ``code_version``, the MLflow tag ``malleable.code_version``).

Only the entry point's own module is refreshed: modules it imports stay as first imported
(docs/service.md, "Fresh code"). Standard-library and installed packages never change under a
running worker in practice and are hashed the same way; an unchanged file costs one read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

# The digest of the source a module was last executed from, kept on the module itself.
_DIGEST_ATTR = "__malleable_code_sha256__"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def module_file(module_name: str) -> Path | None:
    """The ``.py`` file ``module_name`` would be imported from here (parents imported, the module
    not run; the cwd counts as ``load_entry_point`` counts it), or None (none, or not source)."""
    added = os.getcwd() not in sys.path and "" not in sys.path
    if added:
        sys.path.append(os.getcwd())  # only while looking: this process's path stays as it was
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def code_version(entrypoint: str) -> str | None:
    """``sha256:<hex>`` of the entry point's module file (``module:function``), or None."""
    path = module_file(entrypoint.partition(":")[0])
    try:
        return f"sha256:{_digest(path.read_bytes())}" if path is not None else None
    except OSError:
        return None


def refresh(module: ModuleType) -> ModuleType:
    """``module``, re-executed from its file if the file changed since this process executed it.

    The first call records the digest of the file as it is (the import just ran it); a later
    call with other bytes on disk compiles and runs them in the module's namespace, as
    ``importlib.reload`` would, so references to the module object see the new code.
    """
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return module
    try:
        data = Path(path).read_bytes()
    except OSError:
        return module
    digest = _digest(data)
    known = module.__dict__.get(_DIGEST_ATTR)
    if known is None:
        setattr(module, _DIGEST_ATTR, digest)
    elif known != digest:
        exec(compile(data, path, "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - the module's own source, as import runs it
        setattr(module, _DIGEST_ATTR, digest)
    return module
