"""Real elastic training: Dask worker processes, gloo, a tiny MLP. Marked slow (multi-process).

One warmed 3-worker LocalCluster serves the module. The undisturbed reference is a fixed
2-rank run; every elastic scenario trains the same job (same seed, global batch 50, which
splits unevenly over 3 ranks and straddles the 2048-sample epoch at step 40).

Tolerance: with the global batch held, only the order of float32 additions in the gradient
allreduce depends on the world size. Over 44 SGD-momentum steps that noise stays below
1e-4 in the loss here (measured 1.8e-7, the same as a 1-rank run vs the 2-rank run), so
the tolerance leaves ~500x headroom over reduction noise while any change to the samples,
the update or the optimizer state of a step shows up at the loss's own scale (~1).
"""

import math
import os
import signal
import site
import time

import numpy as np
import pytest
from distributed import Client

from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import WorkerPool, warm_up
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.coordinator.lifecycle import CoordinatorState
from elastic_tasks.coordinator.outcomes import JobFailed
from elastic_tasks.coordinator.timeouts import plan_wait_s
from elastic_tasks.protocol import PlanKind, RankExit, TrainConfig
from elastic_tasks.recipe import EntryPointError
from elastic_tasks.rank.data.sharding import EpochSampler
from elastic_tasks.rank.health.straggler import StragglerDetector
from tests.recipe_sources import failing_forward_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"
BATCH, STEPS, DATASET = 50, 44, 2048
LOSS_TOL = 1e-4


@pytest.fixture(scope="module")
def client():
    with local_gpu_cluster(3) as cluster, Client(cluster) as c:
        warm_up(c, ENTRY)
        yield c


def _job(client, name, delays=None, steps=STEPS, **cfg):
    client.wait_for_workers(3, timeout=60)  # killed workers come back under nannies, not at once
    config = TrainConfig(global_batch=BATCH, max_steps=steps, record_indices=True, timeout_s=20.0, **cfg)
    return JobCoordinator(client, WorkerPool(client), f"{name}-{time.monotonic_ns()}", ENTRY, config, delays=delays)


@pytest.fixture(scope="module")
def reference(client):
    job = _job(client, "ref")
    job.start(2)
    return job.wait(120)


def _losses(result):
    """Every step's loss; NaN where only one rank's view of a step survived a failed group."""
    assert [h.step for h in result.history] == list(range(STEPS))
    return np.array([h.loss if h.loss_samples is None else np.nan for h in result.history])


def test_reference_learns(reference):
    losses = _losses(reference)
    assert losses[-5:].mean() < 0.8 * losses[:5].mean()
    assert reference.eval_accuracy is not None and reference.eval_accuracy > 0.5


def test_rescale_2_3_1_keeps_the_loss_curve_and_sees_every_sample_once(client, reference):
    slow = {i: 0.03 for i in range(3)}  # slow enough that the switch steps are reached after the plans
    job = _job(client, "elastic", delays=slow)
    job.start(2)
    out = job.rescale(3, at_step=12)
    inn = job.rescale(1, at_step=28)
    result = job.wait(120)
    assert (out.before, out.after, out.step) == (2, 3, 12) and out.kind == PlanKind.RESCALE
    assert (inn.before, inn.after, inn.step) == (3, 1, 28)
    worlds = {h.step: h.world_size for h in result.history}
    assert worlds[0] == 2 and worlds[12] == 3 and worlds[27] == 3 and worlds[28] == 1
    diff = np.abs(_losses(result) - _losses(reference)).max()
    assert diff < LOSS_TOL, f"max |loss difference| {diff:.3g}"
    assert abs(result.eval_accuracy - reference.eval_accuracy) < 1e-3

    # Every step's samples are exactly the stream's next 50, partitioned among that step's ranks.
    sampler = EpochSampler(DATASET, 0)
    per_step: dict[int, list[int]] = {}
    for rank in result.ranks:
        for step, idx in rank.indices:
            per_step.setdefault(step, []).extend(idx)
    stream = []
    for step in range(STEPS):
        expected = sampler.step_indices(step * BATCH, BATCH)
        assert sorted(per_step[step]) == sorted(expected.tolist()), f"step {step}"
        stream.extend(expected.tolist())
    assert sorted(stream[:DATASET]) == list(range(DATASET))  # epoch 0 exactly once
    assert len(set(stream[DATASET:])) == len(stream) - DATASET
    exits = {r.uid: r.exit for r in result.ranks}
    assert sorted(exits.values()) == sorted([RankExit.FINISHED, RankExit.LEFT, RankExit.LEFT])
    # Measured pauses, not asserted on (a loaded machine moves them): rescale_bench.py reports them.
    assert 0 < out.pause_s < math.inf and 0 < inn.pause_s < math.inf
    S = CoordinatorState
    assert job.lifecycle.history == (S.INIT, S.STARTING, S.RUNNING, S.RESCALING, S.RUNNING, S.RESCALING, S.RUNNING, S.SUCCEEDED)


def test_worker_killed_mid_run_job_shrinks_and_finishes(client, reference):
    job = _job(client, "kill", delays={i: 0.1 for i in range(3)})
    job.start(3)
    while (s := job.status()) is None or s.step < 10:
        time.sleep(0.05)
    victim = job.members[0]  # rank 0: it also hosts the rendezvous
    pid = client.run(os.getpid, workers=[job.worker_of[victim]])[job.worker_of[victim]]
    os.kill(pid, signal.SIGKILL)
    result = job.wait(180)
    assert result.finished and result.steps == STEPS
    assert len(result.recoveries) == 1
    rec = result.recoveries[0]
    assert rec.lost == (victim,) and len(rec.survivors) == 2
    assert rec.steps_lost <= 1 and rec.resumed_step >= 10 and rec.pause_s is not None
    S = CoordinatorState
    assert job.lifecycle.history == (S.INIT, S.STARTING, S.RUNNING, S.RECOVERING, S.RUNNING, S.SUCCEEDED)
    losses = _losses(result)
    # Steps the kill overtook were taken but only survivors' samples are known. Losses are read a step
    # late (issue 34): the step whose agreement was in flight and the one not yet read, the last two.
    partial = [(h.step, h.loss_samples) for h in result.history if h.loss_samples is not None]
    assert len(partial) <= 2 and all(rec.resumed_step - 2 <= k < rec.resumed_step and 0 < n < BATCH for k, n in partial), partial
    diff = np.nanmax(np.abs(losses - _losses(reference)))
    assert diff < LOSS_TOL, f"max |loss difference| {diff:.3g}"


WORDY_RECIPE = failing_forward_recipe("wordy", "connection to the feature store timed out")


def test_a_recipe_error_that_reads_like_a_network_one_fails_the_job(client, tmp_path, monkeypatch):
    # The trainer used to match exception text ("connection", "timed out", ...): this error sent
    # its ranks into recovery, over and over, and the job never ended. It is the recipe's own.
    (tmp_path / "wordy_recipe.py").write_text(WORDY_RECIPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    client.run(site.addsitedir, str(tmp_path))
    client.wait_for_workers(3, timeout=60)
    config = TrainConfig(global_batch=BATCH, max_steps=STEPS, timeout_s=20.0)
    job = JobCoordinator(client, WorkerPool(client), f"wordy-{time.monotonic_ns()}", "wordy_recipe:recipe", config)
    with pytest.raises(JobFailed, match="feature store"):
        job.start(2)
        job.wait(60)
    assert not job.recoveries
    assert job.state is CoordinatorState.FAILED and CoordinatorState.RECOVERING not in job.lifecycle.history
    job.abandon()
    assert job.state is CoordinatorState.FAILED  # final: giving up on it does not make it "stopped"


def test_checkpoint_restart_resumes_at_the_exact_step(client, reference, tmp_path):
    job = _job(client, "restart", delays={i: 0.03 for i in range(6)}, checkpoint_dir=str(tmp_path))
    job.start(2)
    out = job.restart_rescale(3, at_step=15, restart_processes=False)
    result = job.wait(120)
    assert out.restart and out.step == 15
    assert job.state is CoordinatorState.SUCCEEDED and CoordinatorState.RESCALING in job.lifecycle.history
    # Identical parameters after the restart: the rest of the curve is the reference's.
    diff = np.abs(_losses(result) - _losses(reference)).max()
    assert diff < LOSS_TOL, f"max |loss difference| {diff:.3g}"
    # Idempotent: running the finished job again does not train.
    again = _job(client, "restart-again", checkpoint_dir=str(tmp_path))
    again.start(1)
    second = again.wait(60)
    assert second.finished and all(r.history == () for r in second.ranks) and second.steps == STEPS


def test_injected_straggler_is_flagged_within_the_ewma_bound(client):
    # 4 x the bound (steps_to_flag(0.5) = 5): no later step changes the first flag; each costs 0.2 s.
    job = _job(client, "straggler", delays={0: 0.02, 1: 0.02, 2: 0.2}, steps=4 * StragglerDetector.steps_to_flag(0.5))
    job.start(3)
    slow = job.members[2]
    result = job.wait(120)
    assert result.stragglers, "no straggler flagged"
    step, uid = result.stragglers[0]
    assert uid == slow
    # The slowed rank runs at <= 1/2 of the median, so the EWMA crosses 0.8 within this many steps.
    assert step + 1 <= StragglerDetector.steps_to_flag(0.5)
    assert {u for _, u in result.stragglers} == {slow}


def test_bad_entry_point_and_batch_fail_fast_without_tasks(client):
    pool = WorkerPool(client)
    with pytest.raises(EntryPointError, match="no_such_module"):
        JobCoordinator(client, pool, "bad", "no_such_module:fn", TrainConfig(global_batch=8, max_steps=1))
    job = JobCoordinator(client, pool, "bad-batch", ENTRY, TrainConfig(global_batch=2, max_steps=1))
    with pytest.raises(ValueError, match="global_batch=2"):
        job.start(3)
    with pytest.raises(ValueError, match="gpus=4"):
        job.start(4, global_batch=8)
    assert not job.futures and not pool.busy
    assert all(not tasks for tasks in client.processing().values())


def test_dask_executor_runs_the_allocator_loop_on_real_jobs(client):
    """The same loop as the simulator, with a wall clock and real elastic jobs."""
    from allocator.loop import LoopSettings, run_loop
    from allocator.policies import make_policy
    from allocator.types import RescaleKind
    from elastic_tasks.executor import DaskExecutor, WallClock
    from tests.factories import make_job, make_profile

    profile = make_profile("mlp", num_params=6_500, cap=128)
    jobs = [
        make_job("a", profile, workload="mlp", total_samples=24_000, min_batch=32, max_batch=96, max_gpus=3),
        make_job("b", profile, workload="mlp", total_samples=6_000, min_batch=32, max_batch=96, max_gpus=3, arrival_time=1.0),
    ]
    executor = DaskExecutor(client, {"mlp": ENTRY})
    result = run_loop(jobs, make_policy("elastic_dp"), 3, WallClock(), executor, LoopSettings(interval_s=30.0))
    assert all(r.finish is not None and not r.dropped for r in result.jobs)
    for job_id, res in executor.results.items():
        assert res.finished and res.samples_seen >= {"a": 24_000, "b": 6_000}[job_id]
    kinds = {e.kind for e in result.events}
    # b's arrival shrinks a in place (a is long enough to be running then); a's completion grows b in place.
    assert {RescaleKind.START, RescaleKind.IN_PLACE} <= kinds and all(e.measured for e in result.events)
    assert all(0 < e.cost_s < math.inf for e in result.events if e.kind == RescaleKind.IN_PLACE)  # figures: rescale_bench.py
    assert not executor.pool.busy


def test_every_rank_lost_resumes_from_the_last_checkpoint(client, reference, tmp_path, caplog):
    job = _job(client, "all-lost", delays={i: 0.1 for i in range(2)}, checkpoint_dir=str(tmp_path), checkpoint_every=5)
    job.start(2)
    while (s := job.status()) is None or s.step < 12:
        time.sleep(0.05)
    for uid in job.members:
        addr = job.worker_of[uid]
        os.kill(client.run(os.getpid, workers=[addr])[addr], signal.SIGKILL)
    result = job.wait(240)
    assert result.finished and result.steps == STEPS
    rec = result.recoveries[0]
    assert rec.from_checkpoint and rec.survivors and len(rec.lost) == 2
    # The log says why each rank was given up (their workers died), not what dropping them did.
    said = [r.getMessage() for r in caplog.records if "lost every rank" in r.getMessage()]
    assert len(said) == 1 and all(u in said[0] for u in rec.lost) and "cancelled" not in said[0], said
    # From the newest checkpoint at the kill: a multiple of 5 at or after the step seen before it,
    # at most one interval (plus the two steps records lag) behind the last step reported (on a
    # loaded box the ranks run on for a while between the status read and the kill).
    assert rec.resumed_step % 5 == 0 and 10 <= rec.resumed_step <= rec.last_reported_step + 2
    assert rec.last_reported_step - rec.resumed_step < 5 + 2, rec
    S = CoordinatorState
    assert job.lifecycle.history == (S.INIT, S.STARTING, S.RUNNING, S.RECOVERING, S.RUNNING, S.SUCCEEDED)
    # The killed ranks took their records with them; from the checkpoint on, the curve is the reference's.
    steps = [h.step for h in result.history]
    assert steps == list(range(rec.resumed_step, STEPS))
    diff = np.abs(np.array([h.loss for h in result.history]) - _losses(reference)[rec.resumed_step :]).max()
    assert diff < LOSS_TOL, f"max |loss difference| {diff:.3g}"


def test_straggler_removed_and_replaced_in_place(client):
    client.wait_for_workers(3, timeout=60)
    job = JobCoordinator(
        client,
        WorkerPool(client),
        f"remove-{time.monotonic_ns()}",
        ENTRY,
        TrainConfig(global_batch=BATCH, max_steps=60, timeout_s=20.0),
        delays={0: 0.02, 1: 0.3, 2: 0.02},
        remove_stragglers=True,
    )
    job.start(2)
    slow = job.members[1]
    result = job.wait(120)
    assert result.stragglers[0][1] == slow
    assert job.removed_stragglers and job.removed_stragglers[0][1] == slow
    assert slow not in job.members and len(job.members) == 2  # the free worker replaced it


def test_hybrid_scaling_accumulation_keeps_the_curve_and_lr_ramps_with_the_batch(client, reference):
    # Memory cap 10 per micro-batch: 2 ranks x 25 samples -> 3 micro-steps each, then 1 rank x 50 -> 5.
    job = _job(client, "accum", delays={i: 0.03 for i in range(2)}, max_batch_per_gpu=10)
    job.start(2)
    job.rescale(1, at_step=20)
    result = job.wait(120)
    diff = np.abs(_losses(result) - _losses(reference)).max()
    assert diff < LOSS_TOL, f"max |loss difference| {diff:.3g}"

    # Weak scaling: 2 -> 3 ranks with the global batch doubled; LR ramps linearly to 2x over 5 steps.
    job = _job(client, "weak", delays={i: 0.03 for i in range(3)}, lr_ramp_steps=5)
    job.start(2)
    job.rescale(3, global_batch=2 * BATCH, at_step=10)
    result = job.wait(120)
    lr = {h.step: h.lr for h in result.history}
    batch = {h.step: h.global_batch for h in result.history}
    base = lr[0]
    # On a loaded box the plan can land a few steps after at_step (CI: it landed later than 10);
    # the ramp is measured from the step the doubled batch first ran, wherever that was.
    at = min(s for s, b in batch.items() if b == 2 * BATCH)
    assert 10 <= at <= STEPS - 6, at
    assert all(batch[s] == BATCH for s in range(at)) and all(batch[s] == 2 * BATCH for s in range(at, STEPS))
    assert lr[at] == pytest.approx(base) and lr[at + 2] == pytest.approx(base * 1.4) and lr[at + 5] == pytest.approx(2 * base)
    assert result.samples_seen == at * BATCH + (STEPS - at) * 2 * BATCH


@pytest.mark.parametrize("checkpointed", [True, False])
def test_grow_racing_the_jobs_end_returns_none_and_frees_the_workers(client, tmp_path, checkpointed):
    # The loop decides to grow a job in the same instant its last step ends: the coordinator has
    # not collected it yet, so it still has members. The grow must give up at once, send the
    # joiners home and hand their workers back (before: it waited the whole start-up timeout
    # for ranks that never report ready, then failed the cluster run).
    cfg = {"checkpoint_dir": str(tmp_path)} if checkpointed else {}
    job = _job(client, f"race-{checkpointed}", **cfg)
    job.start(1)
    deadline = time.monotonic() + 60
    while not job.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.finished and job.members, "the job should have ended but not yet been collected"
    t0 = time.monotonic()
    assert job.rescale(3) is None
    # A hang bound, not a timing goal: the bug waited out the start-up timeout for ranks that never came.
    assert time.monotonic() - t0 < plan_wait_s(job.config)
    result = job.wait(60)
    assert result.finished and result.steps == STEPS
    # every worker is free again and takes a new rank at once
    pool = WorkerPool(client)
    assert len(pool.free()) == 3
    follow = _job(client, f"after-race-{checkpointed}")
    follow.start(3)
    assert follow.wait(60).finished


def test_a_job_id_runs_again_on_the_same_scheduler(client):
    # A long-lived scheduler (deploy kind "address") keeps each job's plans, events and
    # started-marks; a second run of the same id must not read the first run's.
    client.wait_for_workers(3, timeout=60)
    for _ in range(2):
        job = JobCoordinator(client, WorkerPool(client), "same-id", ENTRY, TrainConfig(global_batch=BATCH, max_steps=5, timeout_s=20.0))
        job.start(2)
        result = job.wait(60)
        assert result.finished and result.steps == 5
        assert all(r.exit != RankExit.DUPLICATE for r in result.ranks)


@pytest.mark.parametrize("entry", ["elastic_tasks.examples.recipes:mlp_tiny_adam", "elastic_tasks.examples.recipes:mlp_tiny_adamw"])
def test_adam_jobs_grow_and_shrink_in_place_on_the_fixed_run_curve(client, entry):
    # Adam/AdamW carry per-parameter moments and a `step` tensor: a joiner must receive all three
    # (grouped by device and dtype) or its first update differs from the survivors' at once.
    steps = 24

    def run(name, rescales, delays=None):
        client.wait_for_workers(3, timeout=60)
        config = TrainConfig(global_batch=BATCH, max_steps=steps, timeout_s=20.0)
        job = JobCoordinator(client, WorkerPool(client), f"{name}-{time.monotonic_ns()}", entry, config, delays=delays)
        job.start(2)
        outcomes = [job.rescale(gpus, at_step=at) for at, gpus in rescales]
        return job.wait(120), outcomes

    fixed, _ = run("adam-ref", [])
    elastic, (grow, shrink) = run("adam-elastic", [(8, 3), (16, 2)], delays={i: 0.06 for i in range(3)})
    # Under heavy load a plan can land a step or two after at_step; the curve must hold wherever.
    assert (grow.before, grow.after, grow.kind) == (2, 3, PlanKind.RESCALE) and 8 <= grow.step < 16
    assert (shrink.before, shrink.after) == (3, 2) and 16 <= shrink.step < steps
    worlds = [h.world_size for h in elastic.history]
    assert worlds == [2] * grow.step + [3] * (shrink.step - grow.step) + [2] * (steps - shrink.step)
    ref = np.array([h.loss for h in fixed.history])
    got = np.array([h.loss for h in elastic.history])
    assert len(ref) == len(got) == steps and ref[-4:].mean() < 0.9 * ref[:4].mean()
    diff = np.abs(got - ref).max()
    assert diff < LOSS_TOL, f"max |loss difference| {diff:.3g}"
    assert abs(elastic.eval_loss - fixed.eval_loss) < LOSS_TOL


def test_tiny_lm_rescales_2_3_2_in_place_on_the_fixed_run_curve(client):
    # The wider contract end to end: dict batches through each rank's DataLoader, a step hook,
    # AdamW, clipping, and the recipe's cosine schedule composed with batch scaling.
    import math

    entry, steps, batch = "elastic_tasks.examples:tiny_lm", 30, 32

    def run(name, rescales, delays=None):
        client.wait_for_workers(3, timeout=60)
        config = TrainConfig(global_batch=batch, max_steps=steps, timeout_s=30.0)
        job = JobCoordinator(client, WorkerPool(client), f"{name}-{time.monotonic_ns()}", entry, config, delays=delays)
        job.start(2)
        outcomes = [job.rescale(gpus, at_step=at) for at, gpus in rescales]
        return job.wait(180), outcomes

    fixed, _ = run("lm-ref", [])
    elastic, (grow, shrink) = run("lm-elastic", [(10, 3), (20, 2)], delays={i: 0.06 for i in range(3)})
    assert 10 <= grow.step < 20 <= shrink.step < steps  # a plan may land a step late under load
    worlds = [h.world_size for h in elastic.history]
    assert worlds == [2] * grow.step + [3] * (shrink.step - grow.step) + [2] * (steps - shrink.step)
    ref = np.array([h.loss for h in fixed.history])
    got = np.array([h.loss for h in elastic.history])
    assert ref[0] > 5.0 and ref[-5:].mean() < 0.7 * ref[0]  # from ~ln(256) towards the byte statistics
    diff = np.abs(got - ref).max()
    assert diff < LOSS_TOL, f"max |loss difference| {diff:.3g}"  # measured 3e-7
    # LR: the recipe's factor by samples seen (own cosine here) times the batch-scaled base LR.
    warmup, total, floor = 320, 32_000, 0.1
    for h in elastic.history:
        seen = h.step * batch
        factor = (seen + 1) / warmup if seen < warmup else floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (seen - warmup) / (total - warmup)))
        assert h.lr == pytest.approx(3e-3 * factor, rel=1e-9), h.step
    names = dict(elastic.eval_metrics)
    assert elastic.eval_accuracy is None and names["bits_per_byte"] == pytest.approx(elastic.eval_loss / math.log(2))
