"""`malleable run` when a job fails inside its ranks: the others finish, the command exits 1 naming
the job and the cause, within seconds of the failure (real Dask workers, real training)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.recipe_sources import failing_forward_recipe

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

BROKEN = failing_forward_recipe("broken", "boom in the user's forward")


def test_a_job_failing_in_its_ranks_is_reported_and_the_others_finish(prefect_api_url, tmp_path):
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
    # The flow run is recorded in the session's Prefect API, not an ephemeral one of its own (~10 s
    # of CPU); the Ctrl-C test below keeps the ephemeral API, whose server the signal must also end.
    env.update(PYTHONPATH=str(REPO), MALLEABLE_WORKERS="2", PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=prefect_api_url)
    proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", "run", "jobs.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(errors) == 1 and "job bad failed" in errors[0] and "boom in the user's forward" in errors[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "good" in proc.stdout  # its row in the results table


def test_ctrl_c_on_a_running_run_exits_at_once_with_one_line_and_leaves_nothing_running(tmp_path, migrated_prefect_home):
    import signal

    import psutil
    from mlflow import MlflowClient

    profile = {
        "workload": "mlp_tiny", "hardware": "test", "num_params": 6532, "batch_sizes": [8, 16, 32, 64],
        "iter_times_s": [0.004, 0.006, 0.010, 0.018], "max_batch_per_gpu": 64,
    }  # fmt: skip
    jobs = [{"id": "long", "workload": "mlp_tiny", "profile": "p", "samples": 5_000_000, "min_batch": 32, "max_batch": 128, "max_gpus": 2}]
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump({"profiles": {"p": profile}, "jobs": jobs}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    # Its own (ephemeral) Prefect API, which the Ctrl-C must end too; on a migrated copy it starts without migrating.
    env.update(PYTHONPATH=str(REPO), MALLEABLE_WORKERS="2", PREFECT_HOME=str(migrated_prefect_home(tmp_path / "prefect")))
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.commands.cli", "run", "jobs.yaml"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 180
    while not list((tmp_path / ".malleable").glob("checkpoints/**/state.pt")):  # training is under way
        assert time.monotonic() < deadline and proc.poll() is None, "the run never started training"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    out, err = proc.communicate(timeout=60)  # the hang bound; how long it took is no assertion (issue 26.6)
    assert proc.returncode == 130, out + err
    lines = [x for x in (out + err).splitlines() if "interrupted" in x]
    assert len(lines) == 1 and "Traceback" not in out + err, out + err

    def left() -> list[int]:
        found = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == proc.pid:
                    found.append(p.pid)
            except (OSError, psutil.Error):
                continue
        return found

    deadline = time.monotonic() + 15
    while left() and time.monotonic() < deadline:  # Prefect's server got the signal too: it ends on its own
        time.sleep(0.5)
    assert left() == []
    # The cluster's processes lead their own groups (so Ctrl-C does not kill them under the clean-up):
    # none of them may outlive the run either.
    def started_here() -> list[int]:
        found = []
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and p.cwd() == str(tmp_path):
                    found.append(p.pid)
            except (OSError, psutil.Error):
                continue
        return found

    deadline = time.monotonic() + 15
    while started_here() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert started_here() == []
    mlflow = MlflowClient(f"sqlite:///{tmp_path / '.malleable' / 'mlflow.db'}")
    runs = mlflow.search_runs(mlflow.search_experiments()[0].experiment_id) if mlflow.search_experiments() else []
    assert runs and {r.info.status for r in runs} == {"KILLED"}
