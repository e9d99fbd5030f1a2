"""Seed 001 execution model: JCT and cost checked by hand on a two-stage job.

The spec (tests/hpo_factories.two_stage_spec): a step of the 64-sample batch takes
0.1 * 64 / (64 g) s of compute on g GPUs plus 2 (g - 1) x 0.01 s of allreduce inside an
instance (0.05 s across instances); a trial run starts in 2 s; each stage ends with a 1 s
barrier. Instances (2 GPUs, $3.60/h = $0.001/s) take 5 s to provision (not billed) and
15 s to initialise (billed); billing rounds up to 10 s with a 60 s minimum; each new
instance downloads 1 GB at $0.50.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from allocator.hpo.model import predict, step_time
from allocator.hpo.spec import Billing, Latency
from tests.hpo_factories import two_stage_spec


def test_step_time_uses_throughput_model_and_accumulates_when_memory_caps() -> None:
    spec = two_stage_spec()
    intra = spec.trial.profile.allreduce
    assert step_time(spec.trial, 1, intra) == pytest.approx(0.1)
    assert step_time(spec.trial, 2, intra) == pytest.approx(0.05 + 0.02)
    # batch 128 on one GPU with a 64-sample cap: two accumulated micro-batches of 64.
    big = dataclasses.replace(spec.trial, batch=128)
    assert step_time(big, 1, intra) == pytest.approx(0.2)


def test_two_stage_shrinking_plan_by_hand() -> None:
    # Stage 0: 4 GPUs -> 2 instances, billed from t=5, ready at t=20; 4 trials of 1 GPU,
    #   2 + 100 x 0.1 = 12 s -> ends 32, barrier -> 33.
    # Stage 1: 2 GPUs -> 1 instance; the other is released at 33 (lived 28 s -> 60 s min).
    #   2 trials of 1 GPU: 2 + 300 x 0.1 = 32 s -> ends 65, barrier -> JCT 66.
    #   The kept instance lived 66 - 5 = 61 s -> 70 s billed.
    p = predict(two_stage_spec(), (4, 2))
    assert p.jct_s == pytest.approx(66.0)
    assert p.compute_cost == pytest.approx((60 + 70) * 0.001)
    assert p.data_cost == pytest.approx(2 * 0.5)
    assert p.cost == pytest.approx(1.13)
    assert [s.start_s for s in p.stages] == pytest.approx([20.0, 33.0])
    assert [s.layout.instances for s in p.stages] == [2, 1]


def test_two_stage_growing_trials_within_an_instance() -> None:
    # Stage 1 on 4 GPUs: 2 trials x 2 GPUs, each on its own instance: 0.05 + 0.02 = 0.07 s/step,
    # 2 + 300 x 0.07 = 23 s -> 33..56, barrier -> 57. Both instances live 52 s -> 60 s minimum.
    p = predict(two_stage_spec(), (4, 4))
    assert p.jct_s == pytest.approx(57.0)
    assert p.cost == pytest.approx(2 * 60 * 0.001 + 1.0)
    assert p.stages[1].layout.split_trials == 0


def test_queued_trials_run_in_waves() -> None:
    # Stage 1 on 1 GPU: the 2 trials run one after the other: 2 x 32 s -> 33..97, JCT 98.
    # Released instance: 60 s; kept one: 98 - 5 = 93 s -> 100 s.
    p = predict(two_stage_spec(), (4, 1))
    assert p.stages[1].layout.waves == 2
    assert p.jct_s == pytest.approx(98.0)
    assert p.cost == pytest.approx((60 + 100) * 0.001 + 1.0)


def test_scale_up_split_trials_pay_cross_instance_allreduce() -> None:
    # Stage 1 on 6 GPUs = 3 instances: 2 trials x 3 GPUs cannot sit on one 2-GPU instance,
    # so both are split and pay 2 x 2 x 0.05 = 0.2 s of allreduce + 0.1 x 22/64 s compute.
    # The third instance is requested at 33: billed from 38, ready at 53.
    step = 0.1 * 22 / 64 + 0.2
    end = 53 + 2 + 300 * step
    p = predict(two_stage_spec(), (4, 6))
    assert p.stages[1].layout.split_trials == 2
    assert p.stages[1].start_s == pytest.approx(53.0)
    assert p.jct_s == pytest.approx(end + 1)
    billed_old = 10 * np.ceil((end + 1 - 5) / 10)
    billed_new = 10 * np.ceil((end + 1 - 38) / 10)
    assert p.compute_cost == pytest.approx((2 * billed_old + billed_new) * 0.001)
    assert p.data_cost == pytest.approx(1.5)


def test_per_function_billing_charges_each_run_rounded() -> None:
    # No minimum: runs of 12 s -> 20 s, of 32 s -> 40 s; $0.0005 per GPU-second.
    p = predict(two_stage_spec(Billing.PER_FUNCTION, min_charge_s=0.0), (4, 2))
    assert p.compute_cost == pytest.approx((4 * 20 + 2 * 40) * 0.0005)
    assert p.jct_s == pytest.approx(66.0)
    # With the 60 s minimum every run is charged a minute.
    q = predict(two_stage_spec(Billing.PER_FUNCTION), (4, 2))
    assert q.compute_cost == pytest.approx(6 * 60 * 0.0005)


def test_billing_exact_multiple_is_not_rounded_up() -> None:
    cloud = two_stage_spec().cloud
    assert cloud.charge(120.0) == 120.0
    assert cloud.charge(120.0000001) == 130.0
    assert cloud.charge(3.0) == 60.0
    assert cloud.charge(0.0) == 0.0


def test_monte_carlo_without_noise_equals_deterministic() -> None:
    spec = two_stage_spec()
    det = predict(spec, (4, 2))
    mc = predict(spec, (4, 2), samples=5, rng=np.random.default_rng(0))
    assert mc.jct_s == pytest.approx(det.jct_s) and mc.cost == pytest.approx(det.cost)
    assert mc.jct_std_s == pytest.approx(0.0)


def test_monte_carlo_stragglers_delay_the_barrier_and_are_reproducible() -> None:
    spec = two_stage_spec()
    noisy = dataclasses.replace(
        spec,
        trial=dataclasses.replace(spec.trial, iter_cv=0.3),
        cloud=dataclasses.replace(spec.cloud, provision=Latency(5.0, 0.5)),
    )
    a = predict(noisy, (4, 2), samples=200, rng=np.random.default_rng(7))
    b = predict(noisy, (4, 2), samples=200, rng=np.random.default_rng(7))
    assert a == b
    # The stage ends at its slowest trial: E[max] > mean, so stragglers lengthen the job.
    assert a.jct_s > predict(spec, (4, 2)).jct_s
    assert a.jct_std_s > 0


def test_monte_carlo_needs_an_explicit_generator() -> None:
    with pytest.raises(ValueError, match="rng"):
        predict(two_stage_spec(), (4, 2), samples=3)


@pytest.mark.parametrize("plan, field", [((4,), "plan"), ((0, 2), r"plan\[0\]"), ((4, 9), r"plan\[1\]"), ((4, 2.0), r"plan\[1\]")])
def test_bad_plans_are_refused(plan: tuple, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        predict(two_stage_spec(), plan)


def test_measured_cost_bills_a_real_timeline_like_the_model() -> None:
    from allocator.hpo.model import MeasuredStage, measured_cost

    spec = two_stage_spec()
    # The (4, 2) timeline without provisioning: instances up at 0, one released at 13 (60 s
    # minimum), the other at 46 (also under the minimum: 60 s).
    stages = [MeasuredStage(0.0, 2, 1, (12.0,) * 4), MeasuredStage(13.0, 1, 1, (32.0, 32.0))]
    assert measured_cost(spec.cloud, stages, 46.0) == pytest.approx((60 + 60) * 0.001 + 2 * 0.5)
    assert measured_cost(spec.cloud, stages, 75.0) == pytest.approx((60 + 80) * 0.001 + 1.0)
    fn = two_stage_spec(Billing.PER_FUNCTION, min_charge_s=0.0).cloud
    assert measured_cost(fn, stages, 46.0) == pytest.approx((4 * 20 + 2 * 40) * 0.0005 + 1.0)
