#!/usr/bin/env bash
# The wheels benchmarks/gpu_validation.py needs beside torch on a machine without network and
# without Dask (the lent GPU machines: Python 3.12, torch, numpy, psutil, msgpack, toolz, ...
# already there). Run where pip reaches PyPI, in any directory; the wheels land in .whl/ at the
# repository's root (git-ignored), the versions this checkout's .venv has. Carry .whl/ to the
# GPU machine: gpu_validation.py installs them into a temporary directory when Dask is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=${PY_VERSION:-3.12}
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
pkgs=""
for name in dask distributed tornado zict tblib locket partd importlib_metadata; do  # the last: Python < 3.12 only
    pkgs="$pkgs $name==$(version $name)"
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl $pkgs
ls .whl
