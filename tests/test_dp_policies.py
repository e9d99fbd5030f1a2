"""elastic_dp and fixed-batch baselines: invariants over random snapshots, exactness on small cases."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.policies import available_policies, make_policy
from allocator.policies.dp import solve_dp, solve_dp_python
from allocator.policies.elastic_dp import job_table
from allocator.throughput import baseline_rate, throughput
from allocator.types import ClusterSnapshot, InfeasibleError, RunningJob, validate_allocation
from tests.factories import make_job, make_profile

profiles = st.builds(
    make_profile,
    num_params=st.integers(1_000_000, 100_000_000),
    overhead_s=st.floats(0.001, 0.05),
    rate=st.floats(200.0, 20_000.0),
    cap=st.sampled_from([16, 32, 64, 128, 256]),
    latency_s=st.floats(0.0, 1e-3),
    seconds_per_param=st.floats(0.0, 5e-9),
)


@st.composite
def jobs(draw, index):
    profile = draw(profiles)
    lo = draw(st.integers(1, 256))
    hi = draw(st.integers(lo, 1024))
    elastic = draw(st.booleans())
    max_gpus = draw(st.integers(1, 16))
    requested = draw(st.integers(1, max_gpus))
    return make_job(
        f"j{index}",
        profile=profile,
        min_batch=lo,
        max_batch=hi,
        max_gpus=max_gpus,
        requested_gpus=requested,
        elastic=elastic,
        arrival_time=float(index),
    )


@st.composite
def snapshots(draw, max_jobs=6, max_gpus=24):
    n = draw(st.integers(0, max_jobs))
    return ClusterSnapshot(time=0.0, capacity=draw(st.integers(1, max_gpus)), queued=tuple(draw(jobs(i)) for i in range(n)))


POLICIES = ["elastic_dp", "fixed_batch", "fixed_batch_dp"]


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=60, deadline=None)
@given(snap=snapshots())
def test_invariants_hold_or_infeasible(name, snap):
    policy = make_policy(name)
    try:
        alloc = policy.allocate(snap)
    except InfeasibleError:
        # Infeasible must be genuine: the jobs' minimum counts cannot all fit.
        needs = [policy.min_gpus(j, snap.capacity) for j in snap.jobs]
        assert None in needs or sum(needs) > snap.capacity
        return
    validate_allocation(alloc, snap, required=[j.id for j in snap.jobs])  # capacity, bounds, everyone >= 1
    for job in snap.jobs:
        if not job.elastic:
            assert alloc[job.id].gpus == job.requested_gpus and alloc[job.id].batch == job.batch_when_fixed
    assert policy.allocate(snap) == alloc  # deterministic


def _objective(snap, alloc):
    """Sum of throughput scaling factors of the shares actually given (seed 000, eq. 3)."""
    return sum(throughput(j.profile, alloc[j.id].batch, alloc[j.id].gpus, alloc[j.id].accum_steps) / baseline_rate(j) for j in snap.jobs)


def _brute_force(snap):
    kmax = min(snap.capacity, max(j.max_gpus for j in snap.jobs))
    rows = []
    for j in snap.jobs:
        t = job_table(j, kmax, None)
        rows.append(t.rates / baseline_rate(j))
    best = -np.inf
    for counts in itertools.product(range(1, kmax + 1), repeat=len(rows)):
        if sum(counts) <= snap.capacity:
            best = max(best, sum(r[k] for r, k in zip(rows, counts)))
    return best


@settings(max_examples=80, deadline=None)
@given(snap=snapshots(max_jobs=5, max_gpus=12))
def test_elastic_dp_equals_exhaustive_search_and_beats_fixed(snap):
    if not snap.jobs:
        return
    brute = _brute_force(snap)
    try:
        alloc = make_policy("elastic_dp").allocate(snap)
    except InfeasibleError:
        assert brute == -np.inf
        return
    assert _objective(snap, alloc) == pytest.approx(brute, abs=1e-9)
    for baseline in ("fixed_batch", "fixed_batch_dp"):
        try:
            fixed = make_policy(baseline).allocate(snap)
        except InfeasibleError:
            continue
        if any(share.accum_steps > 1 for _, share in fixed.shares):
            continue  # a pinned batch over the memory cap accumulates: outside elastic_dp's b_opt(k) candidates
        assert _objective(snap, alloc) >= _objective(snap, fixed) - 1e-9


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.lists(st.floats(0, 10), min_size=4, max_size=4), min_size=1, max_size=6),
    capacity=st.integers(1, 14),
)
def test_vectorised_dp_matches_plain_loops(values, capacity):
    v = np.array([[-np.inf] + row for row in values])
    try:
        counts, opt = solve_dp(v, capacity)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_dp_python(v.tolist(), capacity)
        return
    counts_py, opt_py = solve_dp_python(v.tolist(), capacity)
    assert opt == pytest.approx(opt_py, abs=1e-12)
    assert list(counts) == counts_py  # same tie-breaking


def test_dp_prefers_fewer_gpus_on_ties_and_reports_infeasible():
    flat = np.array([[-np.inf, 1.0, 1.0, 1.0]])
    counts, opt = solve_dp(flat, 3)
    assert list(counts) == [1] and opt == 1.0
    with pytest.raises(InfeasibleError):
        solve_dp(np.array([[-np.inf, 1.0]] * 3), 2)


def test_fixed_batch_keeps_running_jobs_gpus():
    a, b = make_job("a", max_batch=64), make_job("b", max_batch=64)
    snap = ClusterSnapshot(0.0, 4, running=(RunningJob(a, make_policy("fixed_batch").allocate(ClusterSnapshot(0.0, 4, queued=(a,)))["a"]),), queued=(b,))
    alloc = make_policy("fixed_batch").allocate(snap)
    assert alloc["a"] == snap.current_share("a")


def test_random_batch_choice_is_stable_per_job_and_seed():
    job = make_job("a", min_batch=16, max_batch=1024, max_gpus=16, profile=make_profile(cap=1024))
    snap = ClusterSnapshot(0.0, 16, queued=(job,))
    draws = {make_policy("fixed_batch_dp", batch_choice="random", seed=s).allocate(snap)["a"].batch for s in range(8)}
    assert len(draws) > 1
    p = make_policy("fixed_batch_dp", batch_choice="random", seed=3)
    assert p.allocate(snap) == p.allocate(snap)
    with pytest.raises(ValueError, match="batch_choice='huge'"):
        make_policy("fixed_batch", batch_choice="huge")


def test_registry_lists_builtins():
    assert {"elastic_dp", "fixed_batch", "fixed_batch_dp"} <= set(available_policies())
    with pytest.raises(ValueError, match="policy='nope'"):
        make_policy("nope")
