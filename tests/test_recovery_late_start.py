"""A recovery whose new generation starts after the coordinator stopped waiting for it.

Seen on CI's loaded box: every rank was lost, the relaunched rank queued behind another task on
its worker and started after the recovery's wait (``startup_s``); the job trained on to the end,
yet reported RECOVERING all the while and its record said it resumed at step -1. Here the new
generation's rank 0 is held back (``MALLEABLE_SIMULATE_LATE_RANK``) past a shortened wait, on
real gloo ranks of a 3-worker cluster whose killed workers come back under their nannies.
"""

import os
import signal
import time

import pytest
from distributed import Client

from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import WorkerPool, warm_up
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.coordinator.lifecycle import CoordinatorState
from elastic_tasks.protocol import TrainConfig
from elastic_tasks.rank.process_group import LATE_RANK_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"
WAIT_S, HOLD_S = 4.0, 12.0  # the recovery waits WAIT_S for its generation; rank 0 of it checks in after HOLD_S


def _set_env(key: str, value: str) -> None:
    os.environ[key] = value


def test_a_generation_that_starts_after_the_wait_is_running_and_recorded(tmp_path, monkeypatch):
    with local_gpu_cluster(3) as cluster, Client(cluster) as client:
        client.wait_for_workers(3, timeout=120)
        warm_up(client, ENTRY)
        config = TrainConfig(global_batch=24, max_steps=40, timeout_s=20.0, checkpoint_dir=str(tmp_path), checkpoint_every=5)
        job = JobCoordinator(client, WorkerPool(client), f"late-{time.monotonic_ns()}", ENTRY, config, delays={0: 0.1, 1: 0.1})
        job.start(2)
        job.startup_s = WAIT_S  # the recovery's wait, short: the late start below outlasts it
        while (s := job.status()) is None or s.step < 8:
            time.sleep(0.05)
        # Generation 1 (the recovery's) holds its rank 0 back: in the workers alive now, and in the
        # restarted ones (their nannies live in this process and start workers with its environment).
        hold = f"1:0:{HOLD_S:g}"
        monkeypatch.setenv(LATE_RANK_ENV, hold)
        client.run(_set_env, LATE_RANK_ENV, hold)
        for uid in job.members:
            addr = job.worker_of[uid]
            os.kill(client.run(os.getpid, workers=[addr])[addr], signal.SIGKILL)
        result = job.wait(240)
    assert result.finished and result.steps == 40
    [rec] = result.recoveries
    assert rec.from_checkpoint
    # Settled once the generation started: the step it resumed at (a checkpoint's) and its pause.
    assert rec.resumed_step >= 5 and rec.resumed_step % 5 == 0, rec
    assert rec.pause_s is not None, rec
    S = CoordinatorState
    assert job.lifecycle.history == (S.INIT, S.STARTING, S.RUNNING, S.RECOVERING, S.RUNNING, S.SUCCEEDED)
    assert [h.step for h in result.history] == list(range(rec.resumed_step, 40))
