"""Issue 22.1, end to end: ``malleable train ... --gpus 3``, one worker killed mid-run, while a
failed collective *hangs* in the survivors as nccl's does (``MALLEABLE_SIMULATE_NCCL_HANG=1``).

The data-plane timeout is an hour, far past this test's own bound: only the control plane
(the coordinator sees the worker die, says so on the board, each survivor's HangWatch aborts
its communicator) can free the survivors in time. They then shrink in place and the job ends
with exactly steps x global batch samples.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from elastic_tasks.rank.health.hang_watch import SIMULATE_HANG_ENV

STEPS, BATCH = 60, 48
HANG_BOUND_S = 400  # generous: only catches a hang of the whole run


def _dask_workers(proc: psutil.Process) -> list[psutil.Process]:
    """The CLI's worker processes: its nannies live in it, and each worker is forked by the CLI's
    fork server (deploy/forkserver.py), whose children share its command line."""
    found = []
    for child in proc.children(recursive=True):
        try:
            parent = " ".join(child.parent().cmdline())
        except (psutil.Error, AttributeError):
            continue
        if "multiprocessing.forkserver import main" in parent:
            found.append(child)
    return found


@pytest.mark.slow
@pytest.mark.timeout(HANG_BOUND_S + 60)
def test_train_gpus_3_survives_a_killed_worker_when_collectives_hang(tmp_path):
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": repo, SIMULATE_HANG_ENV: "1"}
    malleable = Path(sys.executable).with_name("malleable")
    ckpt = tmp_path / "ckpt"
    cmd = [
        str(malleable), "train", "tests.slow_recipe:mlp_slow", "--gpus", "3", "--steps", str(STEPS), "--batch", str(BATCH),
        "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5", "--timeout", "20", "--data-timeout", "3600",
        "--no-track", "--no-preflight",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + HANG_BOUND_S
        while not (ckpt / "state.pt").exists():  # the job is training (step >= 5)
            assert proc.poll() is None and time.monotonic() < deadline, "the job never reached its first checkpoint"
            time.sleep(0.1)
        workers = _dask_workers(psutil.Process(proc.pid))
        assert len(workers) == 3
        os.kill(workers[1].pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert f"steps {STEPS}, samples {STEPS * BATCH:,}," in out
    assert "lost 1" in out  # one recovery, in place: two survivors trained on
