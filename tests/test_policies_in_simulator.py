"""Every registered policy, on every arrival pattern, runs a small trace to completion within the invariants."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.admission import OverflowMode
from allocator.loop import LoopSettings
from allocator.policies import available_policies, make_policy
from allocator.simulator import simulate
from tests.sim_helpers import small_trace

# Policies that place trainers on named idle nodes need node-level snapshots; they are
# exercised by their own replay tests.
CLUSTER_POLICIES = [p for p in available_policies() if not p.startswith("idle_nodes")]


@pytest.mark.parametrize("name", CLUSTER_POLICIES)
@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 1000),
    pattern=st.sampled_from(["low", "high", "bursty"]),
    capacity=st.integers(2, 24),
    mode=st.sampled_from(list(OverflowMode)),
    react=st.booleans(),
)
def test_policy_completes_trace_within_invariants(name, seed, pattern, capacity, mode, react):
    jobs = small_trace(seed, pattern=pattern, horizon_min=90, scale=1.0)
    specs = {j.id: j for j in jobs}

    def check(step):
        assert step.allocation.total_gpus <= capacity
        for job_id, share in step.allocation.shares:
            spec = specs[job_id]
            assert spec.min_gpus <= share.gpus <= spec.max_gpus
            assert spec.min_batch <= share.global_batch <= spec.max_batch
            assert share.batch_per_gpu <= spec.profile.max_batch_per_gpu
            if not spec.elastic:
                assert share.gpus == spec.requested_gpus and share.global_batch == spec.batch_when_fixed

    result = simulate(jobs, make_policy(name), capacity, LoopSettings(interval_s=300, overflow=mode, react_to_events=react), observer=check)
    for record in result.jobs:
        assert record.dropped or record.finish is not None  # everything admitted completes
        if mode is OverflowMode.QUEUE and record.dropped:
            spec = specs[record.job_id]
            policy = make_policy(name)
            if hasattr(policy, "min_gpus"):
                assert policy.min_gpus(spec, capacity) is None  # only jobs that can never fit
