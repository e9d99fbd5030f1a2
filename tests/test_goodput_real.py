"""The real loop under a goodput model (real Dask workers, gloo, tiny MLP): each running job's
measured noise scale reaches the policy, and work is counted in base-batch-equivalent samples."""

import math

import pytest
from distributed import Client

from allocator.loop import LoopSettings, run_loop
from allocator.policies import make_policy
from allocator.loop.sources import Arrivals
from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import warm_up
from elastic_tasks.executor import DaskExecutor, JobSettings
from tests.factories import make_job, make_profile
from tests.test_noise_wiring import Recording, worth

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENTRY = "tests.slow_recipe:mlp_slow"  # mlp_tiny with steps of at least 30 ms
NOISE = 24.0  # the B_noise the test's model values samples at
B0, BATCH = 8, 32  # job a's base batch (its min_batch) and the batch fixed_batch runs it at
# Base-batch-equivalent samples: 3_200 / E(32) = 5_600 raw samples, 175 steps of at least 30 ms:
# longer than the first few status reports take (the rank's courier sends one every 0.5-2 s).
TOTAL = 3_200


class FixedNoise:
    """A noise model (the executor's ``noise_model``) that values every sample at B_noise = NOISE."""

    def noise_scale(self, job, samples_done, reported=None):
        return NOISE


class AfterFirstEstimate:
    """Job a arrives at once; job b once a's running ranks have reported a noise estimate, so the
    decision b's arrival causes sees a running with a measured value (no timing involved)."""

    def __init__(self, executor, a, b):
        self.executor, self.pending = executor, [a, b]

    def poll(self, now):
        if self.pending and self.pending[0].id == "a":
            return Arrivals(jobs=(self.pending.pop(0),))
        if self.pending and self.executor.noise_scale("a", now) is not None:
            return Arrivals(jobs=(self.pending.pop(0),))
        return Arrivals()

    def next_arrival(self, now):
        return now + 0.05 if self.pending else None


def test_measured_noise_reaches_the_policy_and_a_job_ends_at_its_base_batch_equivalent_work():
    profile = make_profile("mlp", num_params=6_500, cap=128)
    a = make_job("a", profile, workload="mlp", total_samples=TOTAL, min_batch=B0, max_batch=BATCH, max_gpus=2, requested_gpus=2)
    # b: one rank at its base batch (E = 1): it waits for a's GPUs, then runs 4 steps.
    b = make_job("b", profile, workload="mlp", total_samples=128, min_batch=32, max_batch=32, max_gpus=1)
    with local_gpu_cluster(2) as cluster, Client(cluster) as client:
        warm_up(client, ENTRY)
        executor = DaskExecutor(client, {"mlp": ENTRY}, JobSettings(timeout_s=30.0, poll_s=0.05), noise_model=FixedNoise())
        policy = Recording(make_policy("fixed_batch"))
        result = run_loop(AfterFirstEstimate(executor, a, b), policy, 2, executor.clock, executor, LoopSettings(interval_s=60.0))
        executor.close()
    assert result.record("a").finish is not None and result.record("b").finish is not None
    ran = executor.results["a"]

    # 1. The decision at b's arrival saw a running, with the estimate its rank 0 reported.
    reported = [r for _, jid, _, r in policy.seen if jid == "a"]
    assert len(reported) == 1 and reported[0] is not None and reported[0] > 0
    assert executor.noise_scale("a", 0.0) is None  # a finished job reports nothing

    # 2. Its work in base-batch-equivalent samples, counted here from its steps: the executor
    # stopped a once it had done TOTAL, before the trainer's raw budget (TOTAL x 32 / 8).
    steps_needed = math.ceil(TOTAL / (BATCH * worth(NOISE, B0, BATCH)))
    assert all(h.global_batch == BATCH for h in ran.history)
    assert steps_needed <= ran.steps < TOTAL * BATCH // B0 // BATCH
    assert not ran.finished  # stopped by the executor, not finished by the trainer
    # The meter stands where the last status it read (by then past TOTAL) left it.
    assert TOTAL <= executor.progress("a", result.end_time) <= ran.samples_seen * worth(NOISE, B0, BATCH) + 1e-6
    # b at its base batch: equivalent and raw samples agree; the trainer's budget is its total.
    assert executor.results["b"].samples_seen == 128
