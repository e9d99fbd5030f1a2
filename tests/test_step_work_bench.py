"""The step-work benchmark runs small and its counts hold the trainer to issue 34: no host sync
per step, no extra pass over the gradients, few scalar kernels beyond a plain DDP loop's.
Counts, not times: nothing here depends on how busy the host is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]


def test_elastic_step_counts_against_plain_ddp() -> None:
    cmd = [sys.executable, "benchmarks/step_work_bench.py", "--ranks", "1", "--rounds", "10", "--steps", "6", "--warmup", "4", "--retain-steps", "64"]
    out = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for probe in ("off", "on"):
        assert figures[f"r1_{probe}_host_syncs_elastic"] == 0  # its one read per step is of the step before
        assert figures[f"r1_{probe}_lagged_reads_elastic"] >= 1
        assert abs(figures[f"r1_{probe}_grad_passes"]) < 0.05
        assert figures[f"r1_{probe}_collectives"] == 0  # a world of one agrees with nobody: no agreement allreduce
    assert figures["r1_off_kernel_ops"] <= 8


def test_bad_ranks_is_one_line_exit_2() -> None:
    out = subprocess.run([sys.executable, "benchmarks/step_work_bench.py", "--ranks", "0"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == ["--ranks='0': each must be >= 1"]
