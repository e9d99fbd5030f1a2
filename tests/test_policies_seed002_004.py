"""elan_fifo, elan_backfill (seed 002) and efficiency_threshold (seed 004): invariants over
random snapshots, and one test per paper rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.admission import OverflowMode, reallocate
from allocator.policies import make_policy
from allocator.policies.efficiency_threshold import scaling_efficiency
from allocator.admission import SupportsAdmission
from allocator.policies.greedy import build_tables
from allocator.physics.throughput import rate_table
from allocator.types import ClusterSnapshot, InfeasibleError, RunningJob, Share, validate_allocation
from tests.factories import make_job, make_profile
from tests.strategies import snapshots_with_running

POLICIES = ["elan_fifo", "elan_backfill", "efficiency_threshold"]
ELAN = ["elan_fifo", "elan_backfill"]


def minimums_fit(policy, snap: ClusterSnapshot) -> bool:
    needs = [policy.min_gpus(j, snap.capacity) for j in snap.jobs]
    return None not in needs and sum(needs) <= snap.capacity


# ---------------------------------------------------------------- invariants, every policy


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=60, deadline=None)
@given(snap=snapshots_with_running())
def test_allocation_invariants_or_infeasible(name, snap):
    policy = make_policy(name)
    if not minimums_fit(policy, snap):
        with pytest.raises(InfeasibleError):
            policy.allocate(snap)
        return
    allocation = policy.allocate(snap)
    validate_allocation(allocation, snap, required=[j.id for j in snap.jobs])
    assert allocation.total_gpus <= snap.capacity
    for job in snap.jobs:
        share = allocation[job.id]
        assert share.gpus >= max(1, policy.min_gpus(job, snap.capacity))
        if not job.elastic:
            assert (share.gpus, share.global_batch) == (job.requested_gpus, job.batch_when_fixed)
        else:  # hybrid scaling: the batch is b_opt for the GPU count given
            assert share.global_batch == int(rate_table(job, share.gpus).batches[share.gpus])
    # Deterministic: a fresh instance on an equal snapshot answers identically.
    again = make_policy(name).allocate(ClusterSnapshot(snap.time, snap.capacity, snap.running, snap.queued))
    assert again == allocation and again.shares == allocation.shares


@pytest.mark.parametrize("name", ELAN)
@settings(max_examples=40, deadline=None)
@given(snap=snapshots_with_running(), mode=st.sampled_from(list(OverflowMode)), jct_rule=st.booleans())
def test_admission_partitions_queue_and_admitted_jobs_fit(name, snap, mode, jct_rule):
    policy = make_policy(name, jct_rule=jct_rule)
    assert isinstance(policy, SupportsAdmission)
    running_fit = minimums_fit(policy, ClusterSnapshot(snap.time, snap.capacity, snap.running))
    decision = policy.admit(snap, mode)
    ids = [j.id for j in decision.admitted + decision.queued + decision.dropped]
    assert sorted(ids) == sorted(j.id for j in snap.queued)
    assert [j.id for j in decision.admitted] == [j.id for j in snap.queued if j.id in {a.id for a in decision.admitted}]
    if mode is OverflowMode.DROP:
        assert decision.queued == ()
    else:
        assert decision.dropped == ()
    if running_fit:
        trial = ClusterSnapshot(snap.time, snap.capacity, snap.running + tuple(RunningJob(j) for j in decision.admitted))
        validate_allocation(policy.allocate(trial), trial, required=[j.id for j in trial.jobs])
    assert policy.admit(snap, mode) == decision


@settings(max_examples=40, deadline=None)
@given(snap=snapshots_with_running(), jct_rule=st.booleans())
def test_fifo_waits_on_a_suffix_and_backfill_admits_a_superset(snap, jct_rule):
    fifo = make_policy("elan_fifo", jct_rule=jct_rule).admit(snap, OverflowMode.QUEUE)
    bf = make_policy("elan_backfill", jct_rule=jct_rule).admit(snap, OverflowMode.QUEUE)
    waiting = [j.id for j in fifo.queued]
    assert waiting == [j.id for j in snap.queued[len(snap.queued) - len(waiting) :]]
    assert {j.id for j in fifo.admitted} <= {j.id for j in bf.admitted}


@settings(max_examples=50, deadline=None)
@given(snap=snapshots_with_running())
def test_elan_stops_only_when_no_gain_or_no_gpus(snap):
    """Seed 002: GPUs go out until none is left, every job is at max_res, or no gain is positive."""
    policy = make_policy("elan_fifo")
    if not minimums_fit(policy, snap):
        return
    allocation = policy.allocate(snap)
    if allocation.total_gpus == snap.capacity:
        return
    t = build_tables(snap.jobs, snap.capacity)
    done = {r.spec.id: r.samples_done for r in snap.running}
    for i, job in enumerate(snap.jobs):
        k = allocation[job.id].gpus
        if done.get(job.id, 0.0) >= job.total_samples:
            continue  # no work left: no GPU gains it anything, whatever its rate
        if job.elastic and k + 1 < len(t.tables[i].rates) and math.isfinite(t.rate(i, k + 1)):
            assert t.rate(i, k + 1) <= t.rate(i, k)  # one more GPU would not have helped


@pytest.mark.parametrize("threshold", [0.0, 0.1, 0.5, 0.9])
@settings(max_examples=25, deadline=None)
@given(snap=snapshots_with_running())
def test_efficiency_threshold_stops_at_first_inefficient_step(threshold, snap):
    """Seed 004: with GPUs to spare, every elastic job's next step has s_{k,1} <= S."""
    policy = make_policy("efficiency_threshold", threshold=threshold)
    if not minimums_fit(policy, snap):
        return
    allocation = policy.allocate(snap)
    if allocation.total_gpus == snap.capacity:
        return
    t = build_tables(snap.jobs, snap.capacity)
    done = {r.spec.id: r.samples_done for r in snap.running}
    for i, job in enumerate(snap.jobs):
        k = allocation[job.id].gpus
        if done.get(job.id, 0.0) >= job.total_samples:
            continue  # no work left: no GPU gains it anything, whatever its rate
        if job.elastic and k + 1 < len(t.tables[i].rates) and math.isfinite(t.rate(i, k + 1)):
            assert scaling_efficiency(t.rate(i, k), t.rate(i, k + 1), k, k + 1) <= threshold


# ---------------------------------------------------------------- seed 002 rules


def _blocked_head_setup(small_samples: int, small_min_gpus: int):
    """10 GPUs; R runs on 6 (its max) with lots of work; head H needs 8, so it waits for R.

    After R finishes, 2 GPUs are spare beyond H's minimum (the reservation's extra).
    """
    profile = make_profile(cap=32)
    r = make_job("r", profile=profile, min_batch=192, max_batch=192, max_gpus=6, min_gpus=6, total_samples=50_000_000)
    head = make_job("h", profile=profile, min_batch=256, max_batch=256, min_gpus=8, max_gpus=8, arrival_time=1.0)
    small = make_job(
        "s", profile=profile, min_batch=32, max_batch=64, min_gpus=small_min_gpus, max_gpus=small_min_gpus,
        total_samples=small_samples, arrival_time=2.0,
    )
    snap = ClusterSnapshot(
        time=10.0, capacity=10, running=(RunningJob(r, Share(gpus=6, global_batch=192), 0.0),), queued=(head, small)
    )
    return snap


def test_backfill_starts_a_short_job_behind_a_blocked_head_fifo_does_not():
    snap = _blocked_head_setup(small_samples=10_000, small_min_gpus=3)
    fifo = make_policy("elan_fifo").admit(snap, OverflowMode.QUEUE)
    bf = make_policy("elan_backfill").admit(snap, OverflowMode.QUEUE)
    assert [j.id for j in fifo.admitted] == [] and [j.id for j in fifo.queued] == ["h", "s"]
    assert [j.id for j in bf.admitted] == ["s"] and [j.id for j in bf.queued] == ["h"]


def test_backfill_refuses_a_long_job_that_would_hold_the_heads_gpus():
    # 3 GPUs for longer than R runs: more than the 2 spare once H starts, so H would be delayed.
    snap = _blocked_head_setup(small_samples=500_000_000, small_min_gpus=3)
    bf = make_policy("elan_backfill").admit(snap, OverflowMode.QUEUE)
    assert bf.admitted == () and [j.id for j in bf.queued] == ["h", "s"]


def test_backfill_lets_a_long_job_use_the_gpus_spare_after_the_head_starts():
    snap = _blocked_head_setup(small_samples=500_000_000, small_min_gpus=2)
    assert [j.id for j in make_policy("elan_backfill").admit(snap, OverflowMode.QUEUE).admitted] == ["s"]
    assert make_policy("elan_fifo").admit(snap, OverflowMode.QUEUE).admitted == ()


def test_backfill_through_reallocate_is_the_policys_rule_in_drop_mode_nothing_waits():
    snap = _blocked_head_setup(small_samples=10_000, small_min_gpus=3)
    for name in ELAN:
        decision = make_policy(name).admit(snap, OverflowMode.DROP)
        assert [j.id for j in decision.dropped] == ["h"] and [j.id for j in decision.admitted] == ["s"]


def _busy_cluster(running_remaining: int, newcomer_samples: int, newcomer_min_gpus: int):
    """8 GPUs all given to A (nothing idle); a newcomer that fits only by shrinking A."""
    profile = make_profile(seconds_per_param=0.0, latency_s=0.0)
    a = make_job("a", profile=profile, min_batch=8, max_batch=2048, max_gpus=8, total_samples=10_000_000_000)
    c = make_job("c", profile=profile, min_batch=8, max_batch=2048, min_gpus=newcomer_min_gpus, max_gpus=8, total_samples=newcomer_samples)
    done = a.total_samples - running_remaining
    return ClusterSnapshot(time=5.0, capacity=8, running=(RunningJob(a, Share(gpus=8, global_batch=2048), done),), queued=(c,))


def test_elan_admission_starts_a_job_when_it_does_not_raise_average_jct():
    # A has far more work left: the newcomer takes one GPU and barely slows A.
    snap = _busy_cluster(running_remaining=1_000_000_000, newcomer_samples=100_000, newcomer_min_gpus=1)
    assert [j.id for j in make_policy("elan_fifo", jct_rule=True).admit(snap, OverflowMode.QUEUE).admitted] == ["c"]


def test_elan_admission_waits_when_starting_now_would_raise_average_jct():
    # A is nearly done and the newcomer needs 7 of 8 GPUs: squeezing A onto one GPU costs
    # more than letting the newcomer wait the few seconds until A finishes.
    snap = _busy_cluster(running_remaining=200_000, newcomer_samples=100_000_000, newcomer_min_gpus=7)
    decision = make_policy("elan_fifo", jct_rule=True).admit(snap, OverflowMode.QUEUE)
    assert decision.admitted == () and [j.id for j in decision.queued] == ["c"]
    # In DROP mode there is no waiting: since it fits, it starts.
    assert [j.id for j in make_policy("elan_fifo", jct_rule=True).admit(snap, OverflowMode.DROP).admitted] == ["c"]
    # Without the JCT clause (the default) fitting minimums is enough.
    assert [j.id for j in make_policy("elan_fifo").admit(snap, OverflowMode.QUEUE).admitted] == ["c"]


def test_elan_gives_more_gpus_to_the_job_with_more_work_left():
    profile = make_profile()
    big = make_job("big", profile=profile, total_samples=10_000_000)
    small = make_job("small", profile=profile, total_samples=10_000)
    snap = ClusterSnapshot(time=0.0, capacity=8, queued=(small, big))
    allocation = make_policy("elan_fifo").allocate(snap)
    assert allocation["big"].gpus > allocation["small"].gpus >= 1
    assert allocation.total_gpus == 8


def test_elan_leaves_gpus_idle_when_adding_one_would_slow_a_job():
    # Communication so costly that a second GPU lowers throughput: stay on one.
    profile = make_profile(num_params=100_000_000, seconds_per_param=1e-8)
    job = make_job("comm", profile=profile, max_gpus=8)
    allocation = make_policy("elan_fifo").allocate(ClusterSnapshot(time=0.0, capacity=8, queued=(job,)))
    assert allocation["comm"].gpus == 1


def test_ties_go_to_the_earlier_job():
    profile = make_profile()
    first, second = make_job("x", profile=profile, arrival_time=0.0), make_job("y", profile=profile, arrival_time=1.0)
    for name in POLICIES:
        allocation = make_policy(name).allocate(ClusterSnapshot(time=0.0, capacity=3, queued=(first, second)))
        assert (allocation["x"].gpus, allocation["y"].gpus) == (2, 1), name


# ---------------------------------------------------------------- seed 004 rules


def test_scaling_efficiency_matches_the_papers_example():
    assert scaling_efficiency(400.0, 500.0, 4, 5) == pytest.approx(1.0)
    assert scaling_efficiency(400.0, 450.0, 4, 5) == pytest.approx(0.5)
    assert scaling_efficiency(400.0, 380.0, 4, 5) < 0


def _single(profile, capacity=16, **overrides):
    """One job, up to 16 GPUs; its batch grows with GPUs up to 4 x 256, then per-GPU batch shrinks."""
    job = make_job("j", profile=profile, min_batch=16, max_batch=1024, max_gpus=16, **overrides)
    return job, ClusterSnapshot(time=0.0, capacity=capacity, queued=(job,))


def test_efficiency_threshold_stops_a_communication_bound_job_earlier():
    compute = make_profile(num_params=1_000_000, seconds_per_param=1e-12, latency_s=1e-5)
    comm = make_profile(num_params=100_000_000, seconds_per_param=2e-10, latency_s=1e-3)
    policy = make_policy("efficiency_threshold", threshold=0.5)
    k_compute = policy.allocate(_single(compute)[1])["j"].gpus
    k_comm = policy.allocate(_single(comm)[1])["j"].gpus
    assert k_compute == 16
    assert 1 <= k_comm < k_compute


def test_higher_threshold_never_gives_more_gpus():
    profile = make_profile(num_params=50_000_000, seconds_per_param=5e-11, latency_s=5e-4)
    _, snap = _single(profile)
    counts = [make_policy("efficiency_threshold", threshold=s).allocate(snap)["j"].gpus for s in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]


def test_efficiency_threshold_shrinks_a_job_grown_past_its_efficient_size():
    comm = make_profile(num_params=100_000_000, seconds_per_param=2e-10, latency_s=1e-3)
    job, _ = _single(comm)
    grown = ClusterSnapshot(time=60.0, capacity=16, running=(RunningJob(job, Share(gpus=16, global_batch=1024), 1000.0),))
    assert make_policy("efficiency_threshold", threshold=0.5).allocate(grown)["j"].gpus < 16


def test_step_adds_gpus_in_units():
    compute = make_profile(num_params=1_000_000, seconds_per_param=1e-12, latency_s=1e-5)
    _, snap = _single(compute, capacity=15)
    allocation = make_policy("efficiency_threshold", threshold=0.5, step=4).allocate(snap)
    assert allocation["j"].gpus == 15  # 1 -> 5 -> 9 -> 13, then the 2 left


def test_utility_vs_cost_condition():
    profile = make_profile(num_params=100_000_000, seconds_per_param=1e-10, latency_s=1e-4)
    _, snap = _single(profile)
    free = make_policy("efficiency_threshold", utility_per_s=1.0, price_per_gpu_s=0.0).allocate(snap)["j"].gpus
    cheap = make_policy("efficiency_threshold", utility_per_s=1.0, price_per_gpu_s=0.01).allocate(snap)["j"].gpus
    dear = make_policy("efficiency_threshold", utility_per_s=1.0, price_per_gpu_s=100.0).allocate(snap)["j"].gpus
    assert free >= cheap > dear == 1


@pytest.mark.parametrize(
    "params, field",
    [
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": "abc"}, "threshold"),
        ({"step": 0}, "step"),
        ({"utility_per_s": 1.0}, "utility_per_s"),
        ({"utility_per_s": 1.0, "price_per_gpu_s": -2.0}, "price_per_gpu_s"),
    ],
)
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        make_policy("efficiency_threshold", **params)


@pytest.mark.parametrize("name", ELAN)
def test_elan_policies_take_only_jct_rule(name):
    with pytest.raises(ValueError, match=name):
        make_policy(name, threshold=0.1)
    with pytest.raises(ValueError, match="jct_rule"):
        make_policy(name, jct_rule="maybe")
    assert make_policy(name, jct_rule="true").jct_rule is True


@pytest.mark.parametrize("name", POLICIES)
def test_non_elastic_jobs_keep_gpus_and_batch_and_overfull_is_infeasible(name):
    profile = make_profile()
    fixed = make_job("f", profile=profile, elastic=False, requested_gpus=3, fixed_batch=96)
    other = make_job("e", profile=profile, min_gpus=2)
    policy = make_policy(name)
    allocation = policy.allocate(ClusterSnapshot(time=0.0, capacity=10, queued=(fixed, other)))
    assert (allocation["f"].gpus, allocation["f"].global_batch) == (3, 96)
    assert policy.min_gpus(fixed, 10) == 3
    with pytest.raises(InfeasibleError):
        policy.allocate(ClusterSnapshot(time=0.0, capacity=4, queued=(fixed, other)))


@pytest.mark.parametrize("name", POLICIES)
def test_generic_reallocate_runs_the_policy(name):
    profile = make_profile()
    queued = tuple(make_job(f"q{i}", profile=profile, arrival_time=float(i)) for i in range(3))
    decision = reallocate(ClusterSnapshot(time=0.0, capacity=6, queued=queued), make_policy(name), OverflowMode.QUEUE)
    assert decision.allocation.total_gpus <= 6 and len(decision.allocation) == 3
