"""The results file: one JSON per run of the runner (or per measured section of the old docs).

Schema (``SCHEMA`` = 1)::

    {"schema": 1, "source": "python -m benchmarks run --quick" | "docs/benchmarks.md (stop 31)",
     "started_at": ISO-8601 UTC or null, "date": "YYYY-MM-DD" or null,
     "commit": {"sha": str | null, "dirty": bool | null},
     "machine": {"cpu_count", "cpu_model", "python", "torch", "platform"} (null where unknown),
     "load_avg_before": [1, 5, 15 min] | null, "load_avg_after": ... , "nice": int | null,
     "quick": bool | null, "wall_s": float | null, "note": str,
     "benchmarks": [{"name", "script", "command": [argv] | str | null, "status": "ok" | "failed" |
                     "skipped" | "timeout", "reason": str, "exit_code": int | null,
                     "wall_s": float | null, "figures": {...} (the script's JSON line),
                     "repeats": [{...}, ...] (every run's figures when run more than once),
                     "targets": {key: {"op", "target", "direction", "source", "value", "met"}},
                     "output_tail": str}]}
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

SCHEMA = 1
REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


def git_commit(root: Path = REPO) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    # Results written by this very run live under benchmarks/results: they do not make the code dirty.
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return {"sha": sha.strip() if sha else None, "dirty": None if status is None else bool(status.strip())}


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def torch_version() -> str | None:
    # importlib.metadata, not `import torch`: the runner should not pay torch's import (seconds).
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "torch": torch_version(),
        "platform": platform.platform(),
    }


def load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def flatten(figures: Any, prefix: str = "") -> dict[str, float | bool | str]:
    """Scalar leaves of a figures object, nested keys joined with '.' (lists are left out: they are
    per-item series, not one figure)."""
    out: dict[str, float | bool | str] = {}
    if not isinstance(figures, dict):
        return out
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, bool | str) or (isinstance(value, int | float) and math.isfinite(value)):
            out[name] = value
    return out


def lookup(figures: dict[str, Any], key: str) -> Any:
    if key in figures:
        return figures[key]
    node: Any = figures
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def evaluate(op: str, value: Any, target: Any) -> bool | None:
    """Whether ``value op target`` holds; None when either is missing or they do not compare."""
    if value is None or target is None:
        return None
    if op == "==":
        if isinstance(value, int | float) and isinstance(target, int | float) and not isinstance(value, bool):
            return math.isclose(value, target, rel_tol=1e-9, abs_tol=1e-12)
        return value == target
    if isinstance(value, bool) or not isinstance(value, int | float) or not isinstance(target, int | float):
        return None
    return value <= target if op == "<=" else value >= target if op == ">=" else None


def targets_for(bench: Any, figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each of a benchmark's figures that has a target: the value, the target (a relation to
    another figure resolved on the same run) and whether it is met."""
    out: dict[str, dict[str, Any]] = {}
    for fig in bench.figures:
        if fig.op is None:
            continue
        target = lookup(figures, fig.target) if isinstance(fig.target, str) and fig.target in flatten(figures) else fig.target
        value = lookup(figures, fig.key)
        out[fig.key] = {
            "op": fig.op, "target": target, "target_expr": fig.target if isinstance(fig.target, str) else None,
            "direction": fig.direction, "source": fig.source, "value": value, "met": evaluate(fig.op, value, target),
        }  # fmt: skip
    return out


def write(result: dict[str, Any], out_dir: Path, stem: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.json"
    n = 1
    while path.exists():
        n += 1
        path = out_dir / f"{stem}-{n}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    return path


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("benchmarks"), list):
        raise ValueError(f"results file {path}: not a schema-{SCHEMA} benchmarks results file")
    return data


def runs(results_dir: Path = RESULTS) -> list[Path]:
    """The runner's own results files, oldest first (their names start with the UTC start time)."""
    return sorted(p for p in results_dir.glob("*.json") if p.is_file())


def history(results_dir: Path = RESULTS) -> list[Path]:
    return sorted((results_dir / "history").glob("*.json"))


def resolve(ref: str, results_dir: Path = RESULTS) -> Path:
    """A path, or ``latest`` / ``previous`` (the runner's newest / second newest run), or
    ``history`` / ``history:N`` (the newest measured history entry, or the one numbered N)."""
    if ref in ("latest", "previous"):
        found = runs(results_dir)
        need = 1 if ref == "latest" else 2
        if len(found) < need:
            raise FileNotFoundError(f"results: no {ref} run under {results_dir} ({len(found)} runs there)")
        return found[-need]
    if ref == "history" or ref.startswith("history:"):
        found = history(results_dir)
        if ref == "history":
            if not found:
                raise FileNotFoundError(f"results: no history under {results_dir / 'history'}")
            return found[-1]
        hits = [p for p in found if p.stem.startswith(ref.split(":", 1)[1] + "-") or p.stem == ref.split(":", 1)[1]]
        if not hits:
            raise FileNotFoundError(f"results: no history entry {ref.split(':', 1)[1]!r} under {results_dir / 'history'}")
        return hits[0]
    path = Path(ref)
    if not path.is_file():
        raise FileNotFoundError(f"results: {ref} is not a file (nor latest, previous, history[:N])")
    return path
