"""Small HPO specs for the seed-001 tests, with numbers easy to check by hand."""

from __future__ import annotations

from allocator.hpo.spec import Billing, CloudModel, HpoSpec, InstanceType, Latency, Stage, TrialModel
from allocator.types import AllreduceModel, ThroughputProfile


def linear_profile(seconds_at_64: float = 0.1, latency_s: float = 0.01) -> ThroughputProfile:
    """t_proc(b) = seconds_at_64 * b / 64 (one measured point), ring latency only."""
    return ThroughputProfile("toy", 1_000_000, (64,), (seconds_at_64,), 64, AllreduceModel(latency_s, 0.0))


def two_stage_spec(billing: Billing = Billing.PER_INSTANCE, min_charge_s: float = 60.0, deadline_s: float = 1000.0) -> HpoSpec:
    """4 trials x 100 steps, then 2 trials x 300 steps, on 2-GPU instances at $3.60/h."""
    return HpoSpec(
        name="two-stage",
        stages=(Stage(4, 100), Stage(2, 300)),
        trial=TrialModel(linear_profile(), batch=64, startup=Latency(2.0), sync=Latency(1.0)),
        cloud=CloudModel(
            instance=InstanceType("toy.2gpu", 2, 3.6, AllreduceModel(0.05, 0.0)),
            billing=billing,
            granularity_s=10.0,
            min_charge_s=min_charge_s,
            provision=Latency(5.0),
            init=Latency(15.0),
            max_instances=4,
            data_gb=1.0,
            data_price_per_gb=0.5,
        ),
        deadline_s=deadline_s,
    )
