"""The public Python API (``malleable.api``) and the old names of moved modules (issue 38).

``PINNED`` is the promise: every name here stays importable from ``malleable.api`` in every later
release (a name may be added, never silently dropped). The old module names of ``allocator`` keep
answering, with a DeprecationWarning, with the very objects of their new homes.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PINNED = (
    "Allocation", "ClusterSnapshot", "InfeasibleError", "JobRecord", "JobSpec", "JobsFile", "LoopResult", "LoopSettings", "NoiseTrajectory",
    "Physics", "Policy", "PolicyVariant", "RescaleCost", "Rerun", "RunMetrics", "RunningJob", "ScheduleRow", "Share", "SizeKnowledge",
    "ThroughputProfile", "UnknownPolicyError", "Workload", "available_policies", "effective_parameters", "jobs_file_from_dict",
    "load_jobs_file", "make_policy", "noise_from_value", "parse_policy", "physics_of", "policy_defaults", "policy_parameters",
    "read_schedule_csv", "read_summary", "read_trace", "read_workload", "rerun_summary", "run_loop", "schedule_csv", "simulate",
    "spec_from_dict", "spec_to_dict", "summarise", "write_trace",
)  # fmt: skip
# Module -> where it moved (what allocator.MOVED must keep answering for).
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


def test_every_pinned_name_is_public_and_documented():
    api = importlib.import_module("malleable.api")
    missing = [name for name in PINNED if name not in api.__all__ or not hasattr(api, name)]
    assert missing == []
    assert sorted(set(api.__all__)) == sorted(api.__all__)  # no name twice
    docs = (ROOT / "docs" / "api.md").read_text()
    assert [name for name in api.__all__ if f"`{name}`" not in docs] == []


def test_the_api_starts_no_framework():
    script = "import sys, malleable.api; print(sorted(m for m in ('torch', 'prefect', 'dask', 'distributed', 'mlflow') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_a_moved_module_answers_under_its_old_name_with_a_warning(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    target = importlib.import_module(new)
    public = [n for n in vars(target) if not n.startswith("_") and not isinstance(getattr(target, n), type(sys))]
    assert public and all(getattr(module, n) is getattr(target, n) for n in public)
    assert set(importlib.import_module("allocator").MOVED.items()) >= set(MOVED.items())


def test_the_old_physics_module_names_answer_from_the_package():
    from allocator.physics.choice import physics_of

    with pytest.warns(DeprecationWarning, match="allocator.physics.physics_of moved"):
        from allocator.physics import physics_of as old
    assert old is physics_of
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            importlib.import_module("allocator.physics").nothing_here  # noqa: B018
