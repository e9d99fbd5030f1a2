"""A rank that never reaches its generation's rendezvous: its peers must not wait the data timeout.

Real gloo ranks on a 3-worker LocalCluster. ``MALLEABLE_SIMULATE_LATE_RANK=VERSION:RANK:SECONDS``
holds one rank of one generation back before it checks in (``MALLEABLE_SIMULATE_LATE_CONNECT``:
after it checked in, before it connects) (it sleeps well past the control
timeout, as a rank whose worker was busy elsewhere did in docs/benchmarks.md's 15:36 run).
The data timeout is 600 s and the control timeout 5 s: the peers must leave group formation on
the control plane's bound and the job must go on without the missing rank, with every step's
samples seen exactly once. The bound asserted (half the data timeout) is a hang check,
not a timing claim: before the arrival barrier the peers sat the full 600 s in gloo's connect.
"""

import time

import pytest
from distributed import Client

from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import WorkerPool, warm_up
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.coordinator.lifecycle import CoordinatorState
from elastic_tasks.protocol import TrainConfig
from elastic_tasks.rank.process_group import LATE_CONNECT_ENV, LATE_RANK_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"
BATCH, STEPS = 24, 30
# The control timeout bounds only waits on the control plane here (a rendezvous, a plan read, the
# group's connect): a rendezvous whose ranks all read their plan as it was published, and a
# 2-3 rank gloo connect on one host, take well under a second even at load ~6 on 2 cores.
# Every recovery in these tests waits it out once or twice (the peers, then the coordinator).
CONTROL_S, DATA_S = 5.0, 600.0
# The plan wait, a start's patient rendezvous included (its floor: 2 x CONTROL_S): 3 warmed-up
# local workers fork their ranks in about a second, so 20 s (the default: its 60 s floor) still
# waits for a slow start, and for a recovery plan, which the coordinator publishes within
# CONTROL_S + 5 s of the first report (10 s: half the wait left as margin).
PLAN_WAIT_S = 20.0
# Before the arrival barrier the peers sat the whole data timeout in gloo's connect.
HANG_BOUND_S = DATA_S / 2


def _set_env(key, value):
    import os

    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def _running(dask_worker=None):
    return len(dask_worker.state.all_running_tasks)


@pytest.fixture(scope="module")
def client():
    with local_gpu_cluster(3) as cluster, Client(cluster) as c:
        warm_up(c, ENTRY)
        yield c


@pytest.fixture
def late_rank(client):
    """Sets the hook in every worker for one test; afterwards no task is left on any worker.

    The late rank's task was given up by the coordinator, but a Dask task cannot be stopped: it
    sleeps out the rest of its hold (up to 100 s). Its worker is restarted instead (its nanny
    starts a fresh process, without the hook), which frees it in seconds, not the hold."""

    def hold(version, rank, seconds, env=LATE_RANK_ENV):
        client.run(_set_env, env, f"{version}:{rank}:{seconds:g}")

    yield hold
    for env in (LATE_RANK_ENV, LATE_CONNECT_ENV):
        client.run(_set_env, env, None)
    busy = [address for address, running in client.run(_running).items() if running]
    if busy:
        client.restart_workers(busy, timeout=120)
        client.wait_for_workers(3, timeout=120)
        warm_up(client, ENTRY)
    deadline = time.monotonic() + 200
    while any(client.run(_running).values()) and time.monotonic() < deadline:
        time.sleep(0.5)


def _job(client, name, **cfg):
    client.wait_for_workers(3, timeout=60)
    config = TrainConfig(
        global_batch=BATCH, max_steps=STEPS, record_indices=True, timeout_s=CONTROL_S, data_timeout_s=DATA_S, plan_wait_s=PLAN_WAIT_S, **cfg
    )
    return JobCoordinator(client, WorkerPool(client), f"{name}-{time.monotonic_ns()}", ENTRY, config, delays={i: 0.05 for i in range(4)})


def _assert_every_sample_once(result):
    assert result.finished and result.steps == STEPS
    assert result.samples_seen == STEPS * BATCH
    per_step: dict[int, list[int]] = {}
    for rank in result.ranks:
        for step, idx in rank.indices:
            per_step.setdefault(step, []).extend(idx)
    assert sorted(per_step) == list(range(STEPS))
    for step, idx in per_step.items():
        assert len(idx) == BATCH and len(set(idx)) == BATCH, f"step {step}: {len(idx)} samples, {len(set(idx))} distinct"


def test_rank_0_never_checks_in_at_the_start_the_other_two_train_on(client, late_rank):
    # Rank 0 hosts the store: it opened the rendezvous, then checks in only after its peers
    # (a start's ranks wait the plan wait, PLAN_WAIT_S here, as some may still be starting) and the
    # coordinator (CONTROL_S + 5 s for its report) have given up on it.
    late_rank(0, 0, 100)
    job = _job(client, "late-host")
    t0 = time.monotonic()
    outcome = job.start(3)
    waited = time.monotonic() - t0
    assert waited < HANG_BOUND_S, f"start took {waited:.0f} s: the peers waited in group formation"
    (rec,) = job.recoveries
    uids = [f"{job.job_id}-r{n}" for n in range(3)]
    assert (rec.failed_version, rec.version, rec.lost, rec.survivors) == (0, 1, (uids[0],), (uids[1], uids[2]))
    assert outcome.after == 2 and job.world_size == 2
    result = job.wait(240)
    _assert_every_sample_once(result)
    assert rec.resumed_step == 0
    assert all(h.world_size == 2 for h in result.history)
    S = CoordinatorState
    assert job.lifecycle.history == (S.INIT, S.STARTING, S.RECOVERING, S.RUNNING, S.SUCCEEDED)


def test_a_joiner_that_never_checks_in_the_members_train_on(client, late_rank):
    # A grow 2 -> 3 at a declared step: the new rank (rank 2 of generation 1) checks in only
    # after the members (CONTROL_S) and the coordinator (CONTROL_S + 5 s for its report) have given up on it.
    late_rank(1, 2, 40)
    job = _job(client, "late-joiner", hold_at_steps=frozenset({10}))
    job.start(2)
    t0 = time.monotonic()
    outcome = job.rescale(3, at_step=10)
    waited = time.monotonic() - t0
    assert waited < HANG_BOUND_S, f"the grow took {waited:.0f} s: the members waited in group formation"
    (rec,) = job.recoveries
    joiner = f"{job.job_id}-r2"
    assert rec.failed_version == 1 and rec.lost == (joiner,) and rec.survivors == (f"{job.job_id}-r0", f"{job.job_id}-r1")
    assert outcome is not None and (outcome.version, outcome.before, outcome.after) == (2, 2, 2)
    result = job.wait(240)
    _assert_every_sample_once(result)
    assert rec.resumed_step == 10 and rec.steps_lost == 0
    assert all(h.world_size == 2 for h in result.history)
    S = CoordinatorState
    assert job.lifecycle.history == (S.INIT, S.STARTING, S.RUNNING, S.RESCALING, S.RECOVERING, S.RUNNING, S.SUCCEEDED)


def test_a_rank_lost_after_checking_in_before_connecting_the_others_train_on(client, late_rank):
    # Rank 1 checks in, then is held before gloo's connect: its peers are in the connect, which
    # used to take the data timeout (600 s) as its bound; it is the control timeout's now.
    # (Without the control bound the peers simply waited the hold out in the connect, and the
    # job started on 3 ranks when rank 1 came back: no recovery.)
    hold_s = 100
    late_rank(0, 1, hold_s, env=LATE_CONNECT_ENV)
    job = _job(client, "late-connect")
    t0 = time.monotonic()
    outcome = job.start(3)
    waited = time.monotonic() - t0
    assert waited < hold_s, f"start took {waited:.0f} s: the peers waited in gloo's connect for the held rank"
    (rec,) = job.recoveries
    uids = [f"{job.job_id}-r{n}" for n in range(3)]
    assert (rec.failed_version, rec.lost, rec.survivors) == (0, (uids[1],), (uids[0], uids[2]))
    assert outcome.after == 2 and job.world_size == 2
    result = job.wait(240)
    _assert_every_sample_once(result)
    assert all(h.world_size == 2 for h in result.history)
