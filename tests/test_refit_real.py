"""The real loop refits a running job's throughput model from its own steps (real Dask workers,
gloo, an MLP whose steps last at least 30 ms) and the policy decides on the refitted model."""

import statistics

import pytest
from distributed import Client

from allocator.loop import LoopSettings, run_loop
from allocator.policies import make_policy
from allocator.loop.sources import Arrivals
from allocator.physics.throughput import t_comm, t_proc
from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import warm_up
from elastic_tasks.executor import DaskExecutor, JobSettings
from tests.factories import make_job, make_profile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENTRY = "tests.slow_recipe:mlp_slow"
BATCH = 32  # job a's only batch (min = max), on its 2 ranks: 16 samples each, no accumulation under the cap
STEPS = 250  # >= 7.5 s of steps: far longer than the first reports after the warm-up take (one every 0.5-2 s)
SEEN = 60  # b arrives once a has run this many steps: a refit on ~50 steps, the prior faded
WARMUP = 3  # the executor's default (RefitSettings.warmup_steps); the oracle drops as many


class SeenProfiles:
    """Decides like ``inner``; keeps each running job's profile as the snapshot gave it."""

    def __init__(self, inner):
        self.inner, self.name, self.seen = inner, "seen", []

    def allocate(self, snapshot):
        self.seen += [(r.spec.id, r.spec.profile) for r in snapshot.running if r.share is not None]
        return self.inner.allocate(snapshot)

    def min_gpus(self, job, capacity):
        return self.inner.min_gpus(job, capacity)


class AfterRefit:
    """Job a arrives at once; job b once a has reported SEEN steps and the executor has a refitted
    profile of it, so the decision b's arrival causes sees a running with it (no timing involved)."""

    def __init__(self, executor, a, b):
        self.executor, self.pending = executor, [a, b]

    def poll(self, now):
        if self.pending and self.pending[0].id == "a":
            return Arrivals(jobs=(self.pending.pop(0),))
        job = self.executor.jobs.get("a")
        status = job.status() if job is not None else None
        if self.pending and status is not None and status.step >= SEEN and self.executor.profile("a", now) is not None:
            return Arrivals(jobs=(self.pending.pop(0),))
        return Arrivals()

    def next_arrival(self, now):
        return now + 0.05 if self.pending else None


def test_a_running_jobs_refitted_profile_reaches_the_policy_and_models_its_measured_step():
    # An offline profile about twice too fast: 15 ms steps where the recipe sleeps 30 ms per step.
    prior = make_profile("mlp", num_params=6_500, overhead_s=0.015, rate=100_000.0, cap=128)
    a = make_job("a", prior, workload="mlp", total_samples=STEPS * BATCH, min_batch=BATCH, max_batch=BATCH, max_gpus=2, requested_gpus=2)
    b = make_job("b", prior, workload="mlp", total_samples=128, min_batch=32, max_batch=32, max_gpus=1)
    with local_gpu_cluster(2) as cluster, Client(cluster) as client:
        warm_up(client, ENTRY)
        executor = DaskExecutor(client, {"mlp": ENTRY}, JobSettings(timeout_s=30.0, poll_s=0.05))
        policy = SeenProfiles(make_policy("fixed_batch"))
        result = run_loop(AfterRefit(executor, a, b), policy, 2, executor.clock, executor, LoopSettings(interval_s=60.0))
        executor.close()
    assert result.record("a").finish is not None and result.record("b").finish is not None

    # 1. The decision at b's arrival saw a running, with a refitted profile (not the spec's).
    (seen,) = [p for jid, p in policy.seen if jid == "a"]
    assert seen != prior and seen.max_batch_per_gpu == prior.max_batch_per_gpu
    assert executor.profile("a", 0.0) is None  # a finished job reports nothing

    # 2. Its modelled step at a's share (2 ranks x 16 samples, one host) against the median of
    # the steps a itself recorded, its first WARMUP dropped. No band on measured seconds (a shared
    # box moves them): what is certain is the recipe's 30 ms sleep per step, which the refitted
    # model must have learned (the prior says ~15 ms), and that it models a's steps better than
    # the prior does.
    ran = executor.results["a"]
    assert {(h.world_size, h.global_batch) for h in ran.history} == {(2, BATCH)}
    measured = statistics.median(h.wall_s for h in ran.history[WARMUP:])
    modelled = float(t_proc(seen, BATCH // 2)) + float(t_comm(seen.allreduce, seen.num_params, 2))
    assert measured >= 0.03
    prior_modelled = float(t_proc(prior, BATCH // 2)) + float(t_comm(prior.allreduce, prior.num_params, 2))
    assert prior_modelled < 0.6 * 0.03  # the prior alone is far off the sleep
    assert modelled >= 0.9 * 0.03  # the refit learned the sleep (means over intervals: a little below at worst)
    assert abs(modelled - measured) < abs(prior_modelled - measured)
