"""Recovery on real gloo ranks of a 3-worker cluster whose killed workers come back under their nannies.

* A generation that starts after the coordinator stopped waiting for it. Seen on CI's loaded box:
  every rank was lost, the relaunched rank queued behind another task on its worker and started
  after the recovery's wait (``startup_s``); the job trained on to the end, yet reported
  RECOVERING all the while and its record said it resumed at step -1. Here the new generation's
  rank 0 is held back (``MALLEABLE_SIMULATE_LATE_RANK``) past a shortened wait.
* A survivor blocked in a collective on a live peer. Seen in the suite under load: a killed rank's
  neighbour raised and reported, the third rank sat in the allreduce waiting on that neighbour,
  and the recovery, which told no one the generation was over, counted it lost after the control
  timeout. Here one rank leaves the step's collective alive (an injected local failure), so
  its peers can only be freed by the control plane: the data-plane timeout is an hour.
"""

import os
import signal
import site
import time

import pytest
from distributed import Client

from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import WorkerPool, warm_up
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.coordinator.lifecycle import CoordinatorState
from elastic_tasks.protocol import TrainConfig
from elastic_tasks.rank.process_group import LATE_RANK_ENV
from tests.recipe_sources import local_collective_failure_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"
WAIT_S, HOLD_S = 4.0, 12.0  # the recovery waits WAIT_S for its generation; rank 0 of it checks in after HOLD_S


def _set_env(key: str, value: str) -> None:
    os.environ[key] = value


@pytest.fixture(scope="module")
def client():
    with local_gpu_cluster(3) as cluster, Client(cluster) as c:
        c.wait_for_workers(3, timeout=120)
        warm_up(c, ENTRY)
        yield c


# First in the file: the test below kills every worker and changes the restarted ones' environment.
def test_a_survivor_blocked_on_a_live_peer_is_freed_and_continues(client, tmp_path, monkeypatch):
    marker = tmp_path / "fail-once"
    marker.touch()
    (tmp_path / "local_failure_recipe.py").write_text(local_collective_failure_recipe("local_failure", str(marker), rank=1, after_calls=10))
    monkeypatch.syspath_prepend(str(tmp_path))
    client.run(site.addsitedir, str(tmp_path))
    config = TrainConfig(global_batch=24, max_steps=30, timeout_s=20.0, data_timeout_s=3600.0)
    job = JobCoordinator(client, WorkerPool(client), f"blocked-{time.monotonic_ns()}", "local_failure_recipe:recipe", config)
    job.start(3)
    members = job.members
    result = job.wait(240)
    assert not marker.exists(), "the injected failure never fired"
    assert result.finished and result.steps == 30
    [rec] = result.recoveries
    # Every rank was alive: all three report and train on (before, the two blocked ones were
    # counted lost after the control timeout and one rank finished the job alone).
    assert rec.lost == () and rec.survivors == members, rec
    assert rec.steps_lost <= 1 and not rec.from_checkpoint, rec
    assert [h.step for h in result.history] == list(range(30))
    S = CoordinatorState
    assert job.lifecycle.history == (S.INIT, S.STARTING, S.RUNNING, S.RECOVERING, S.RUNNING, S.SUCCEEDED)


def test_a_generation_that_starts_after_the_wait_is_running_and_recorded(client, tmp_path, monkeypatch):
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
