"""A batch-only change on real gloo ranks: same process group, new batch from the agreed step on.

Two Dask worker processes, the tiny MLP, global batch 50 on 2 ranks; at step 12 the batch
doubles. The batch-only plan must not rebuild the process group (no rendezvous is opened for
its generation, unlike any regroup) and must train exactly what a regrouped job training the
same batches trains: the same samples at every step (drawn here from the sampler's stream by
hand) and the same loss curve as a job that regroups 2 -> 1 rank at the same step with the same
new batch (only the order of the allreduce's float additions differs: the module tolerance of
test_elastic_system, 1e-4, applies). Marked slow (multi-process).
"""

import time

import numpy as np
import pytest
from distributed import Client

from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import WorkerPool, warm_up
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.protocol import PlanKind, TrainConfig
from elastic_tasks.rank.data.sharding import EpochSampler

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"
BATCH, STEPS, SWITCH, DATASET = 50, 20, 8, 2048
LOSS_TOL = 1e-4


@pytest.fixture(scope="module")
def client():
    with local_gpu_cluster(2) as cluster, Client(cluster) as c:
        warm_up(c, ENTRY)
        yield c


def _job(client, name):
    client.wait_for_workers(2, timeout=60)
    config = TrainConfig(global_batch=BATCH, max_steps=STEPS, record_indices=True, timeout_s=20.0, lr_ramp_steps=4)
    # A little delay per step: the plans are published well before the switch step is reached.
    return JobCoordinator(client, WorkerPool(client), f"{name}-{time.monotonic_ns()}", ENTRY, config, delays={0: 0.02, 1: 0.02})


def test_batch_only_change_keeps_the_group_and_trains_the_new_batch(client):
    job = _job(client, "batch")
    start = job.start(2)
    change = job.rescale(2, global_batch=2 * BATCH, at_step=SWITCH)
    # Read the board before the job is collected: the start opened a rendezvous, the batch change must not.
    assert job.board.rendezvous(start.version, timeout=5)[1] > 0
    with pytest.raises(TimeoutError):
        job.board.rendezvous(change.version, timeout=2)
    result = job.wait(120)
    assert (change.kind, change.before, change.after, change.step) == (PlanKind.BATCH, 2, 2, SWITCH)
    assert change.pause_s is not None and change.pause_s >= 0
    history = {h.step: h for h in result.history}
    assert sorted(history) == list(range(STEPS))
    assert [history[t].global_batch for t in range(STEPS)] == [BATCH] * SWITCH + [2 * BATCH] * (STEPS - SWITCH)
    assert {h.world_size for h in result.history} == {2}
    # Every step trained exactly its share of the sample stream at its batch (drawn by hand here).
    sampler, seen = EpochSampler(DATASET, 0), 0
    ranks = [dict(r.indices) for r in result.ranks]
    for t in range(STEPS):
        batch = history[t].global_batch
        trained = sorted(i for r in ranks for i in r[t])
        assert trained == sorted(int(i) for i in sampler.step_indices(seen, batch)), t
        seen += batch
    assert result.samples_seen == seen
    # The learning rate follows the progressive linear rule from the switch step (ramp of 4 steps).
    base = history[0].lr
    assert history[SWITCH].lr == pytest.approx(base) and history[SWITCH + 2].lr == pytest.approx(1.5 * base)
    assert history[SWITCH + 4].lr == pytest.approx(2 * base)

    regrouped = _job(client, "regroup")
    regrouped.start(2)
    shrink = regrouped.rescale(1, global_batch=2 * BATCH, at_step=SWITCH)
    reference = regrouped.wait(120)
    assert shrink.kind == PlanKind.RESCALE and shrink.step == SWITCH
    ours = np.array([history[t].loss for t in range(STEPS)])
    theirs = np.array([h.loss for h in sorted(reference.history, key=lambda h: h.step)])
    assert np.abs(ours - theirs).max() < LOSS_TOL
    print(f"batch-only switch pause {change.pause_s:.4f} s vs regroup 2->1 pause {shrink.pause_s:.4f} s")


def test_a_declared_switch_step_holds_the_ranks_until_its_plan_is_read(client):
    """``hold_at_steps``: a plan published long after its step would have passed still lands on
    it. Without the hold the undelayed 20 steps are over within the sleep and the shrink never
    happens (``rescale`` returns None); with it the ranks wait at step 8 for the plan."""
    client.wait_for_workers(2, timeout=60)
    config = TrainConfig(global_batch=BATCH, max_steps=STEPS, timeout_s=20.0, hold_at_steps=frozenset({SWITCH}))
    job = JobCoordinator(client, WorkerPool(client), f"hold-{time.monotonic_ns()}", ENTRY, config)
    job.start(2)
    time.sleep(4.0)
    assert job.status() is not None and job.status().step <= SWITCH  # held, not finished
    shrink = job.rescale(1, at_step=SWITCH)
    result = job.wait(120)
    assert shrink is not None and (shrink.kind, shrink.step) == (PlanKind.RESCALE, SWITCH)
    worlds = {h.step: h.world_size for h in result.history}
    assert [worlds[t] for t in range(STEPS)] == [2] * SWITCH + [1] * (STEPS - SWITCH)


def test_the_policys_accumulation_reaches_the_ranks_whole(client):
    """``start``/``rescale`` with ``accum_steps`` (the policy's ``Share.accum_steps``): the ranks
    run that many micro-steps, not their own rule's 1 (no memory cap here), and an
    accumulation-only change is a batch-only plan on the same group."""
    client.wait_for_workers(2, timeout=60)
    config = TrainConfig(global_batch=BATCH, max_steps=STEPS, timeout_s=20.0, hold_at_steps=frozenset({SWITCH}))
    job = JobCoordinator(client, WorkerPool(client), f"accum-{time.monotonic_ns()}", ENTRY, config)
    job.start(2, accum_steps=5)
    deadline = time.monotonic() + 60
    while (job.status() is None or job.status().step < 3) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job.status().accum_steps == 5
    change = job.rescale(2, accum_steps=1, at_step=SWITCH)
    result = job.wait(120)
    assert change is not None and (change.kind, change.step) == (PlanKind.BATCH, SWITCH)
    assert job.status().accum_steps == 1
    # The micro-steps change the float summation order only: every step trained, batch unchanged.
    assert sorted(h.step for h in result.history) == list(range(STEPS)) and {h.global_batch for h in result.history} == {BATCH}
