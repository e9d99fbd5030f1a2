"""Two costs every test process pays that the suite can spare it (a plugin, registered by conftest).

* Bytecode: where ``PYTHONDONTWRITEBYTECODE`` is set (this sandbox; many CI images) Python reads
  ``.pyc`` files but never writes them, so each of the suite's ~300 Python subprocesses (CLIs,
  servers, spawned ranks) compiled every project module it imported, again. The session compiles
  the project once, before any test process starts (~0.6 CPU-s; up-to-date files are skipped).
* The cyclic garbage collector: in a test process every full collection walked everything the
  imports and the collection made, ~0.25 s each (24 of them were a fifth of a test process's own
  CPU in a 44-file run). Those objects live for the session: frozen once collection is done, the
  collector walks only what tests make (``gc.freeze``, as the Python docs advise for such a heap).
"""

from __future__ import annotations

import compileall
import gc
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def project_packages(root: Path = ROOT) -> list[Path]:
    """The repository's top-level Python packages (each a folder with an ``__init__.py``)."""
    return sorted(p for p in root.iterdir() if (p / "__init__.py").is_file())


def compile_project(root: Path = ROOT) -> bool:
    """Writes the bytecode of every project module that lacks an up-to-date one; True if all compiled."""
    return all([compileall.compile_dir(package, quiet=1) for package in project_packages(root)])


class _FreezeAfterCollection:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        gc.freeze()


def register(config: pytest.Config, controller: bool) -> None:
    """From ``pytest_configure``: the controller (or a serial run) compiles before any test process
    starts; every process that runs tests freezes its heap once it has collected them."""
    if controller:
        compile_project()
    config.pluginmanager.register(_FreezeAfterCollection(), "malleable-freeze-after-collection")
