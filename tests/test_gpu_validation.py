"""Issue 22.5: benchmarks/gpu_validation.py runs the product, and on CPU says what it skipped."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS, BATCH = 60, 24


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cpu_path_runs_the_product_and_lists_the_gpu_only_parts():
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_validation.py"), "--only", "device_assignment,profile_amp,elastic_in_place,killed_rank,probe_overhead",
         "--models", "tests.slow_recipe:mlp_slow", "--steps", str(STEPS), "--batch", str(BATCH)],
        cwd=REPO, capture_output=True, text=True, timeout=580,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["cuda"] is False and figures["gpus"] == 0
    assert set(figures["skipped"]) == {"profile_amp", "probe_overhead"}
    assert "needs 1 CUDA device" in figures["skipped"]["profile_amp"]
    grown = figures["elastic_in_place"]
    assert "no CUDA" in grown["skipped_parts"]
    run = grown["mlp_slow"]
    assert run["plan"] == "1->2->1" and run["samples"] == STEPS * BATCH and len(run["pause_s"]) == 2
    killed = figures["killed_rank"]["mlp_slow"]
    assert killed["finished"] and killed["samples_exact"] and killed["recoveries"] == 1 and killed["survivors"] == 2


def test_an_unknown_check_is_one_line_exit_2():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_validation.py"), "--only", "nope"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--only='nope': unknown check 'nope'" in out.stderr and "Traceback" not in out.stderr
