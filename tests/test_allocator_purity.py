"""allocator/ is pure: every submodule imports with prefect, dask, distributed, torch and mlflow unavailable."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("prefect", "dask", "distributed", "torch", "mlflow")

# Run in a fresh interpreter: this test process may already have imported the blocked
# packages (other tests do), and a cached module would hide a forbidden import.
SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = {blocked!r}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"allocator must not import {{name}}")
            return None

    sys.meta_path.insert(0, Block())
    import allocator
    names = ["allocator"]
    for info in pkgutil.walk_packages(allocator.__path__, "allocator."):
        importlib.import_module(info.name)
        names.append(info.name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print(len(names))
    """
).format(blocked=BLOCKED)


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_allocator_module_imports_without_heavy_dependencies():
    done = _run(SCRIPT)
    assert done.returncode == 0, done.stderr
    count = int(done.stdout.strip().splitlines()[-1])
    assert count == len(list((ROOT / "allocator").rglob("*.py")))  # every file is a module we walked


def test_the_blocker_really_blocks():
    """The guard itself works: the same script fails for a package that imports torch."""
    probe = SCRIPT.replace("import allocator\n", "import allocator\nimport torch\n", 1)
    done = _run(probe)
    assert done.returncode != 0 and "must not import torch" in done.stderr


def test_allocator_modules_import_each_other_at_module_level_only() -> None:
    # Issue 16: the Elan policies imported allocator.admission inside functions to dodge a
    # cycle (admission -> policies package -> elan -> admission). The protocols now sit at the
    # bottom (allocator/protocols.py), so no allocator module needs a lazy allocator import.
    import ast

    # A package's module-level ``__getattr__`` (PEP 562) is the one exception: it defers a heavy
    # name for start-up cost (allocator.loop's run_loop pulls in every policy, numpy and pulp, its
    # records the trust model, numpy; the job store and `malleable jobs` need only the job states
    # of allocator.loop.lifecycle), not to dodge a cycle.
    lazy = []
    for path in sorted((ROOT / "allocator").rglob("*.py")):
        tree = ast.parse(path.read_text())
        module_getattr = {id(f) for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"}
        for func in ast.walk(tree):
            if id(func) in module_getattr:
                continue
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(func):
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("allocator"):
                        lazy.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert lazy == []
