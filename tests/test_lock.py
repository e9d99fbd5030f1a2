"""Issue 35.6: the image installs from a lock file, and the lock covers what the package needs at
run time within pyproject's own ranges (no test tools, torch left to the build's index)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _lock() -> dict[str, str]:
    lines = [line for line in (ROOT / "deploy" / "requirements.lock").read_text().splitlines() if line and not line.startswith("#")]
    pins = dict(line.split("==", 1) for line in lines)
    assert len(pins) == len(lines), "every line pins one package exactly"
    return {canonicalize_name(k): v for k, v in pins.items()}


def test_the_dockerfile_installs_with_the_lock_as_constraints():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    copied = re.search(r"^COPY --from=package /src/deploy/requirements\.lock (\S+)$", dockerfile, re.M)
    assert copied and re.search(rf"pip install -c {re.escape(copied.group(1))} .*malleable-\*\.whl", dockerfile)


def test_every_runtime_dependency_is_pinned_within_pyprojects_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _lock()
    for line in project["dependencies"]:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name == "torch":
            assert name not in pins  # from the build's index: the CPU or the CUDA wheel
            continue
        assert name in pins, f"{name} is not locked"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req.specifier}"
    test_only = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["test"]}
    assert test_only.isdisjoint(pins), test_only & set(pins)
