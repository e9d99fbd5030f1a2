"""Three costs every test process pays that the suite can spare it (a plugin, registered by conftest).

* Bytecode: where ``PYTHONDONTWRITEBYTECODE`` is set (this sandbox; many CI images) Python reads
  ``.pyc`` files but never writes them, so each of the suite's ~300 Python subprocesses (CLIs,
  servers, spawned ranks) compiled every project module it imported, again. The session compiles
  the project once, before any test process starts (~0.6 CPU-s; up-to-date files are skipped).
* The cyclic garbage collector: in a test process every full collection walked everything the
  imports and the collection made, ~0.25 s each (24 of them were a fifth of a test process's own
  CPU in a 44-file run). Those objects live for the session: frozen once collection is done, the
  collector walks only what tests make (``gc.freeze``, as the Python docs advise for such a heap).
* Leaving: once a parallel run's test process has reported its last result it runs its exit
  handlers (clusters closed, child processes joined, logs flushed) and leaves; the interpreter's
  own teardown of a heap that held torch, Prefect, MLflow and Dask (module by module, object by
  object: ~2.5 s each, four processes on two cores at the very end of the run) is skipped.
"""

from __future__ import annotations

import atexit
import compileall
import gc
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def project_packages(root: Path = ROOT) -> list[Path]:
    """The repository's top-level Python packages (each a folder with an ``__init__.py``)."""
    return sorted(p for p in root.iterdir() if (p / "__init__.py").is_file())


def compile_project(root: Path = ROOT) -> bool:
    """Writes the bytecode of every project module that lacks an up-to-date one; True if all compiled."""
    # A list, not a generator: a package that fails to compile must not stop the others compiling.
    return all([compileall.compile_dir(package, quiet=1) for package in project_packages(root)])


class _FreezeAfterCollection:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        gc.freeze()


class _LeaveWithoutTeardown:
    """For an xdist worker: it has sent its last report (``workerfinished``, at session finish)
    before ``pytest_unconfigure``; the controller reads nothing more from it."""

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(0)


def register(config: pytest.Config, controller: bool) -> None:
    """From ``pytest_configure``: the controller (or a serial run) compiles before any test process
    starts; every process that runs tests freezes its heap once it has collected them; a parallel
    run's test processes leave without tearing their heap down."""
    if controller:
        compile_project()
    config.pluginmanager.register(_FreezeAfterCollection(), "malleable-freeze-after-collection")
    if not controller:
        config.pluginmanager.register(_LeaveWithoutTeardown(), "malleable-leave-without-teardown")
