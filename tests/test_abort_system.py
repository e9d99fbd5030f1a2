"""Issue 34.4, end to end: the real abort of a generation's group, then recovery in place.

``malleable train ... --gpus 3`` on gloo, each rank held in one step until its group is aborted
(``tests/held_recipe.py``: where a GPU rank's host waits on a hung nccl kernel). One held rank's
worker is killed. Only the control plane can free the others: the coordinator declares the
generation lost, each survivor's hang watch aborts its group (``_abort_process_group``), the
survivor goes on to its step's agreement on the aborted group — and must enter recovery
there, not fail. The two survivors shrink in place and the job ends with exactly
steps x batch samples. The data-plane timeout is an hour: no other way out in time.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.held_recipe import HOLD_BOUND_S, HOLD_DIR_ENV

STEPS, BATCH, RANKS = 20, 24, 3
RUN_BOUND_S = HOLD_BOUND_S + 120  # generous: only catches a hang of the whole run


@pytest.mark.slow
@pytest.mark.timeout(RUN_BOUND_S + 60)
def test_survivors_of_a_real_abort_recover_and_shrink_in_place(tmp_path):
    repo = str(Path(__file__).resolve().parents[1])
    held = tmp_path / "held"
    held.mkdir()
    env = {**os.environ, "PYTHONPATH": repo, HOLD_DIR_ENV: str(held)}
    malleable = Path(sys.executable).with_name("malleable")
    cmd = [
        str(malleable), "train", "tests.held_recipe:mlp_held", "--gpus", str(RANKS), "--steps", str(STEPS), "--batch", str(BATCH),
        "--timeout", "20", "--data-timeout", "3600", "--no-track", "--no-preflight",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + RUN_BOUND_S
        while len(list(held.iterdir())) < RANKS:  # every rank is held in the same step
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks never reached the held step"
            time.sleep(0.1)
        victim = int(sorted(p.name for p in held.iterdir())[0])
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert f"steps {STEPS}, samples {STEPS * BATCH:,}," in out
    assert "lost 1" in out  # one recovery, in place: the two survivors trained on
