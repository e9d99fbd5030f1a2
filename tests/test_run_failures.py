"""`malleable run` when a job fails inside its ranks: the others finish, the command exits 1 naming
the job and the cause, within seconds of the failure (real Dask workers, real training)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

BROKEN = textwrap.dedent(
    """
    import dataclasses

    import torch.distributed as dist

    from elastic_tasks.examples import mlp_tiny


    class Breaks(dist.__class__ if False else object):
        pass


    def recipe():
        base = mlp_tiny()
        build = base.build_model

        def build_model():
            model = build()
            forward = model.forward

            def failing_forward(x):
                # Fine in the pre-flight check (no process group); fails in a rank's first steps.
                if dist.is_initialized():
                    raise RuntimeError("boom in the user's forward")
                return forward(x)

            model.forward = failing_forward
            return model

        return dataclasses.replace(base, name="broken", build_model=build_model)
    """
)


def test_a_job_failing_in_its_ranks_is_reported_and_the_others_finish(tmp_path):
    (tmp_path / "brokenrecipe.py").write_text(BROKEN)
    profile = {
        "workload": "mlp_tiny", "hardware": "test", "num_params": 6532, "batch_sizes": [8, 16, 32, 64],
        "iter_times_s": [0.004, 0.006, 0.010, 0.018], "max_batch_per_gpu": 64,
    }  # fmt: skip
    jobs = [
        {"id": "bad", "workload": "brokenrecipe:recipe", "profile": "p", "samples": 50_000, "min_batch": 32, "max_batch": 64, "max_gpus": 1},
        {"id": "good", "workload": "mlp_tiny", "profile": "p", "samples": 30_000, "min_batch": 32, "max_batch": 64, "max_gpus": 1},
    ]
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump({"profiles": {"p": profile}, "jobs": jobs}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(PYTHONPATH=str(REPO), MALLEABLE_WORKERS="2", PREFECT_HOME=str(tmp_path / "prefect"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", "jobs.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    took = time.monotonic() - t0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(errors) == 1 and "job bad failed" in errors[0] and "boom in the user's forward" in errors[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "good" in proc.stdout  # its row in the results table
    assert took < 300
