"""The image contains the product: the wheel is built the way deploy/Dockerfile builds it (an sdist,
then the wheel from the unpacked sdist), installed on its own into a fresh directory, and run
from there — every top-level package imports, ``malleable --help`` answers, a flow imports.

The wheel is installed with ``--no-deps`` into a target directory that comes first on
``PYTHONPATH``; its dependencies (torch, prefect, …) come from this virtualenv, whose editable
install of the checkout would otherwise hide a package the wheel forgot — so every module is
checked to load from the target, not from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_SHIPPED = {"tests", "benchmarks"}  # run from a checkout (`python -m benchmarks`), never installed


def repo_packages() -> set[str]:
    """Top-level packages of the checkout, found on disk (not from the build configuration)."""
    return {d.name for d in ROOT.iterdir() if (d / "__init__.py").is_file()} - NOT_SHIPPED


def repo_modules() -> set[str]:
    """Every .py file of those packages, relative to the root."""
    return {str(p.relative_to(ROOT)) for pkg in repo_packages() for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts}


def _hook(hook: str, source: Path, out: Path) -> Path:
    """Run a PEP 517 hook of setuptools in ``source`` (what `python -m build` does, without the
    isolated environment it would download)."""
    code = f"from setuptools import build_meta; print(build_meta.{hook}({str(out)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(sdist, wheel built from the unpacked sdist)."""
    tmp = tmp_path_factory.mktemp("image")
    sdist = _hook("build_sdist", ROOT, tmp)
    with tarfile.open(sdist) as tar:
        # The "data" filter refuses links and absolute paths; Pythons before 3.11.4 have no filters.
        tar.extractall(tmp / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (source,) = (tmp / "unpacked").iterdir()
    wheel = _hook("build_wheel", source, tmp)
    return sdist, wheel


def test_every_top_level_package_and_module_is_in_the_wheel(built):
    _, wheel = built
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {n.split("/")[0] for n in names if n.count("/") == 1 and n.endswith("/__init__.py")}
    assert repo_packages() <= packages, f"missing from the wheel: {sorted(repo_packages() - packages)}"
    assert {"allocator", "elastic_tasks", "flows", "service", "deploy"} <= packages
    assert repo_modules() <= names, f"modules missing from the wheel: {sorted(repo_modules() - names)[:10]}"
    assert not any(n.startswith("tests/") for n in names)


def test_the_sdist_carries_what_the_image_runs_deployments_from(built):
    """The image unpacks the sdist as MALLEABLE_HOME: prefect.yaml's entry points and its jobs files are there."""
    import yaml

    sdist, _ = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    for deployment in project["deployments"]:
        assert deployment["entrypoint"].split(":")[0] in names
        jobs_file = deployment.get("parameters", {}).get("jobs_file")
        if jobs_file:
            assert jobs_file in names
    assert "prefect.yaml" in names and "deploy/prefect_steps.py" in names


def test_the_dockerfile_installs_the_built_wheel_not_a_list_of_folders():
    lines = [line.strip() for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines() if not line.strip().startswith("#")]
    text = "\n".join(lines)
    assert "python -m build" in text and ".whl" in text
    copies = [line for line in lines if line.startswith("COPY ")]
    # One COPY of the build context into the build stage; the run stage takes only the built
    # packages and the lock they install against (issue 35.6).
    assert copies == ["COPY . .", "COPY --from=package /dist /dist", "COPY --from=package /src/deploy/requirements.lock /tmp/requirements.lock"], copies


@pytest.mark.slow
def test_the_wheel_alone_runs_the_cli_and_imports_every_package_and_a_flow(built, tmp_path):
    _, wheel = built
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target), "MALLEABLE_STATE_DIR": str(tmp_path / "state")}
    env.pop("MALLEABLE_HOME", None)
    packages = sorted(repo_packages())
    probe = (
        "import importlib, sys\n"
        f"for name in {packages!r} + ['flows.cluster_flow', 'flows.commands.cli', 'service.client']:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(target)!r}), (name, module.__file__)\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
    script = target / "bin" / "malleable"
    assert script.is_file()  # the console script of [project.scripts]
    cli = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "Usage" in cli.stdout and "serve" in cli.stdout and "submit" in cli.stdout
