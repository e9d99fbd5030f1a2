"""goodput_dp against brute force: own goodput, own batch enumeration, own GPU-count enumeration."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.physics.goodput import NoiseTrajectory
from allocator.policies import make_policy
from allocator.types import ClusterSnapshot, InfeasibleError, RunningJob, validate_allocation
from tests.factories import make_job, make_profile

RATE = 2_000.0
OVERHEAD = 0.005


def own_goodput(job, k, noise, batch):
    """T(B, k) with the fewest accumulation steps that fit, times (Bn + B0) / (Bn + B); 0 if infeasible."""
    p = job.profile
    cap = p.max_batch_per_gpu
    s = math.ceil(batch / (k * cap))
    if batch < k * s:
        return 0.0
    micro = math.ceil(batch / (k * s))
    a, b = p.allreduce.latency_s, p.allreduce.seconds_per_param
    comm = 0.0 if k == 1 else 2 * (k - 1) * a + 2 * (k - 1) / k * p.num_params * b
    b0 = job.fixed_batch or job.min_batch
    return batch / (s * (OVERHEAD + micro / RATE) + comm) * (noise + b0) / (noise + batch)


def own_best(job, k, noise):
    if not job.elastic:
        return own_goodput(job, k, noise, job.batch_when_fixed)
    return max(own_goodput(job, k, noise, b) for b in range(job.min_batch, job.max_batch + 1))


def allowed(job, k):
    return k == job.requested_gpus if not job.elastic else job.min_gpus <= k <= job.max_gpus


def term(speedup, p):
    return math.log(speedup) if p == 0 else speedup**p if p > 0 else -(speedup**p)


def weights(jobs, noises, remaining, exponent):
    """(R_j / geometric mean of R)^-exponent, R_j = remaining work / one-GPU goodput: a job's run alone on one GPU."""
    runs = [max(r, 1.0) / own_best(j, 1, n) if own_best(j, 1, n) > 0 else None for j, n, r in zip(jobs, noises, remaining)]
    known = [r for r in runs if r is not None]
    if not known:
        return [1.0] * len(jobs)
    scale = math.exp(sum(math.log(r) for r in known) / len(known))
    return [1.0 if r is None else (r / scale) ** -exponent for r in runs]


def brute(jobs, noises, capacity, p, remaining=None, exponent=0.0):
    """Best sum of (weighted) power-mean terms over every assignment of counts (None: infeasible)."""
    w = weights(jobs, noises, remaining or [1.0] * len(jobs), exponent)
    rows = []
    for job, noise, wj in zip(jobs, noises, w):
        one = own_best(job, 1, noise)
        rows.append({k: wj * term(own_best(job, k, noise) / one, p) for k in range(1, capacity + 1)
                     if allowed(job, k) and own_best(job, k, noise) > 0})
    best = None
    for counts in itertools.product(*[sorted(r) for r in rows]):
        if sum(counts) <= capacity:
            v = sum(r[k] for r, k in zip(rows, counts))
            best = v if best is None else max(best, v)
    return best


@st.composite
def instances(draw):
    n = draw(st.integers(1, 3))
    capacity = draw(st.integers(n, 7))
    jobs, noises, running = [], [], []
    for i in range(n):
        profile = make_profile(f"w{i}", num_params=draw(st.integers(1_000_000, 80_000_000)), rate=RATE, overhead_s=OVERHEAD,
                               cap=draw(st.sampled_from([16, 32, 64])))
        lo = draw(st.integers(8, 64))
        elastic = draw(st.integers(0, 4)) > 0  # mostly elastic
        max_gpus = draw(st.integers(1, 5))
        job = make_job(f"j{i}", profile, workload=f"w{i}", min_batch=lo, max_batch=lo + draw(st.integers(0, 200)),
                       max_gpus=max_gpus, requested_gpus=draw(st.integers(1, max_gpus)), elastic=elastic,
                       total_samples=10_000, arrival_time=float(i))
        jobs.append(job)
        noises.append(draw(st.floats(10.0, 3000.0)))
        running.append(draw(st.booleans()))
    return jobs, noises, running, capacity


@pytest.mark.parametrize("exponent", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("p", [1.0, 0.0, -1.0])
@settings(max_examples=30, deadline=None)
@given(case=instances())
def test_goodput_dp_reaches_the_brute_force_optimum(p, exponent, case):
    jobs, noises, running, capacity = case
    # A running job half done sees its trajectory's second value: the policy must read progress.
    trajectories = {j.workload: NoiseTrajectory((0.0, 0.5, 1.0), (1e9, n)) if r else NoiseTrajectory.constant(n)
                    for j, n, r in zip(jobs, noises, running)}
    snap = ClusterSnapshot(
        0.0, capacity,
        running=tuple(RunningJob(j, None, samples_done=6_000.0) for j, r in zip(jobs, running) if r),
        queued=tuple(j for j, r in zip(jobs, running) if not r),
    )
    order = [j for j in snap.jobs]
    noise_of = {j.id: n for j, n in zip(jobs, noises)}
    left = {j.id: j.total_samples - (6_000.0 if r else 0.0) for j, r in zip(jobs, running)}
    optimum = brute(order, [noise_of[j.id] for j in order], capacity, p, [left[j.id] for j in order], exponent)
    w = dict(zip([j.id for j in order], weights(order, [noise_of[j.id] for j in order], [left[j.id] for j in order], exponent)))
    policy = make_policy("goodput_dp", noise=trajectories, p=p, remaining_exponent=exponent)
    try:
        alloc = policy.allocate(snap)
    except InfeasibleError:
        assert optimum is None
        return
    assert optimum is not None
    validate_allocation(alloc, snap, required=[j.id for j in order])
    got = 0.0
    for j in order:
        share = alloc[j.id]
        assert share.accum_steps == math.ceil(share.global_batch / (share.gpus * j.profile.max_batch_per_gpu))
        g = own_goodput(j, share.gpus, noise_of[j.id], share.global_batch)
        assert g == pytest.approx(own_best(j, share.gpus, noise_of[j.id]), rel=1e-9)  # best batch for its count
        got += w[j.id] * term(g / own_best(j, 1, noise_of[j.id]), p)
    assert got == pytest.approx(optimum, rel=1e-9, abs=1e-9)


def test_negative_p_shares_gpus_more_evenly_than_total_goodput():
    """A near-linear job and one whose goodput gains little per GPU: p = 1 feeds the scalable one,
    lower p moves GPUs to the job with the smaller speedup (a count, checked monotone)."""
    fast = make_job("fast", make_profile("a", num_params=1_000_000, rate=RATE), workload="a", min_batch=64, max_batch=2048, max_gpus=8)
    slow = make_job("slow", make_profile("b", num_params=10_000_000, rate=RATE), workload="b", min_batch=64, max_batch=512, max_gpus=8)
    noise = {"a": NoiseTrajectory.constant(1e5), "b": NoiseTrajectory.constant(200.0)}
    snap = ClusterSnapshot(0.0, 8, queued=(fast, slow))
    slow_gpus = [make_policy("goodput_dp", noise=noise, p=p).allocate(snap)["slow"].gpus for p in (1.0, 0.0, -1.0, -5.0)]
    assert slow_gpus == sorted(slow_gpus) and slow_gpus[0] == 1 and slow_gpus[-1] >= 4
    with pytest.raises(ValueError, match="goodput_dp.p"):
        make_policy("goodput_dp", p=float("nan"))


def test_a_reported_noise_scale_overrides_the_trajectory():
    """The trainer's estimate (RunningJob.noise_scale) decides the batch: tiny B_noise -> the base batch."""
    job = make_job("r", make_profile("a", rate=RATE, overhead_s=OVERHEAD), workload="a", min_batch=32, max_batch=512, max_gpus=1)
    trajectory = {"a": NoiseTrajectory.constant(1e9)}  # says: any batch is free
    policy = make_policy("goodput_dp", noise=trajectory)
    free = policy.allocate(ClusterSnapshot(0.0, 1, running=(RunningJob(job, None, 0.0),)))
    noisy = policy.allocate(ClusterSnapshot(0.0, 1, running=(RunningJob(job, None, 0.0, noise_scale=1.0),)))
    best_free = max(range(32, 513), key=lambda b: own_goodput(job, 1, 1e9, b))
    best_noisy = max(range(32, 513), key=lambda b: own_goodput(job, 1, 1.0, b))
    assert (free["r"].global_batch, noisy["r"].global_batch) == (best_free, best_noisy)
    assert best_noisy < best_free
    with pytest.raises(ValueError, match="noise_scale"):
        RunningJob(job, None, 0.0, noise_scale=-1.0)


@st.composite
def running_instances(draw):
    """2-3 elastic jobs, each running on a share that fits, with work left; capacity at least their shares."""
    n = draw(st.integers(2, 3))
    jobs, shares, done, noises = [], [], [], []
    for i in range(n):
        profile = make_profile(f"w{i}", num_params=draw(st.integers(1_000_000, 40_000_000)), rate=RATE, overhead_s=OVERHEAD, cap=64)
        lo = draw(st.integers(8, 32))
        job = make_job(f"j{i}", profile, workload=f"w{i}", min_batch=lo, max_batch=lo + draw(st.integers(0, 150)), max_gpus=4,
                       total_samples=draw(st.integers(2_000, 400_000)))  # fmt: skip
        jobs.append(job)
        shares.append(draw(st.integers(1, 4)))
        done.append(draw(st.floats(0.0, 0.99)) * job.total_samples)
        noises.append(draw(st.floats(10.0, 3000.0)))
    capacity = draw(st.integers(sum(shares), sum(shares) + 3))
    return jobs, shares, done, noises, capacity


@settings(max_examples=40, deadline=None)
@given(case=running_instances(), cost=st.sampled_from([0.0, 5.0, 30.0]), exponent=st.sampled_from([0.0, 0.25]))
def test_rescale_cost_is_weighed_over_each_jobs_remaining_time(case, cost, exponent):
    """A running job moved off its GPU count averages goodput(k) R / (R + cost) over the R seconds its
    remaining work then takes; the policy must reach the best sum of power-mean terms of that, by brute force."""
    jobs, shares, done, noises, capacity = case
    from allocator.types import Share

    snap = ClusterSnapshot(0.0, capacity, running=tuple(RunningJob(j, Share(k, j.min_batch), d) for j, k, d in zip(jobs, shares, done)))
    rows = []
    w = weights(jobs, noises, [j.total_samples - d for j, d in zip(jobs, done)], exponent)
    for job, k0, d, noise, wj in zip(jobs, shares, done, noises, w):
        one = own_best(job, 1, noise)
        row = {}
        for k in range(1, min(capacity, job.max_gpus) + 1):
            g = own_best(job, k, noise)
            if g <= 0:
                continue
            left = (job.total_samples - d) / g
            row[k] = wj * term(g * (1.0 if k == k0 else left / (left + cost)) / one, 1.0)
        rows.append(row)
    best = max(sum(r[k] for r, k in zip(rows, ks)) for ks in itertools.product(*[sorted(r) for r in rows]) if sum(ks) <= capacity)
    noise = {j.workload: NoiseTrajectory.constant(n) for j, n in zip(jobs, noises)}
    alloc = make_policy("goodput_dp", noise=noise, p=1.0, rescale_cost_s=cost, remaining_exponent=exponent).allocate(snap)
    got = sum(r[alloc[j.id].gpus] for r, j in zip(rows, jobs))
    assert got == pytest.approx(best, rel=1e-9)
    if cost == 0.0:
        return
    # The pause weighs most on a job close to its end: with its work nearly done it keeps its count.
    ending = [RunningJob(j, Share(k, j.min_batch), j.total_samples * 0.999999) for j, k in zip(jobs, shares)]
    kept = make_policy("goodput_dp", noise=noise, p=1.0, rescale_cost_s=cost, remaining_exponent=exponent).allocate(ClusterSnapshot(0.0, capacity, running=tuple(ending)))
    assert [kept[j.id].gpus for j in jobs] == shares


def test_shortest_queue_starts_the_shortest_predicted_run_first_and_guards_the_long_waiter():
    """queue=shortest: with one GPU free the queued job with the least work per one-GPU goodput
    (own goodput, own batch enumeration) starts; a job that has waited its own predicted run goes
    ahead of shorter ones; strict: a head that does not fit blocks the rest."""
    from allocator.protocols import OverflowMode
    from allocator.types import Share

    profile = make_profile("a", rate=RATE, overhead_s=OVERHEAD, cap=64)
    noise = 300.0
    sizes = {"long": 90_000, "short": 20_000, "mid": 50_000}
    queued = tuple(make_job(n, profile, workload="a", min_batch=16, max_batch=128, max_gpus=4, total_samples=s, arrival_time=float(i))
                   for i, (n, s) in enumerate(sizes.items()))  # fmt: skip
    runs = {j.id: j.total_samples / own_best(j, 1, noise) for j in queued}
    assert sorted(runs, key=runs.get) == ["short", "mid", "long"]
    busy = make_job("busy", profile, workload="a", min_batch=16, max_batch=128, max_gpus=4, total_samples=10**6)
    running = (RunningJob(busy, Share(1, 16), 0.0),)
    policy = make_policy("goodput_dp", default_noise_scale=noise)
    at = queued[0].arrival_time + 10.0  # nobody has waited long
    first = policy.admit(ClusterSnapshot(at, 2, running=running, queued=queued), OverflowMode.QUEUE)
    assert [j.id for j in first.admitted] == ["short"] and {j.id for j in first.queued} == {"mid", "long"}
    late = queued[0].arrival_time + runs["long"] + 1.0  # "long" has waited its own run; "short" has too, and came later
    aged = policy.admit(ClusterSnapshot(late, 2, running=running, queued=queued), OverflowMode.QUEUE)
    assert [j.id for j in aged.admitted] == ["long"]
    fifo = make_policy("goodput_dp", default_noise_scale=noise, queue="fifo")
    assert not hasattr(fifo, "admit")  # fifo leaves admission to the loop (arrival order)
    wide = make_job("wide", profile, workload="a", min_batch=16, max_batch=128, min_gpus=2, max_gpus=4, total_samples=1_000, arrival_time=5.0)
    blocked = policy.admit(ClusterSnapshot(at, 2, running=running, queued=queued + (wide,)), OverflowMode.QUEUE)
    assert blocked.admitted == ()  # the shortest needs 2 GPUs, 1 is free: nobody passes it
    backfill = make_policy("goodput_dp", default_noise_scale=noise, strict_fifo=False)
    passed = backfill.admit(ClusterSnapshot(at, 2, running=running, queued=queued + (wide,)), OverflowMode.QUEUE)
    assert [j.id for j in passed.admitted] == ["short"]  # backfill: the next shortest that fits passes it
    with pytest.raises(ValueError, match="goodput_dp.queue"):
        make_policy("goodput_dp", queue="lifo")
    with pytest.raises(ValueError, match="goodput_dp.remaining_exponent"):
        make_policy("goodput_dp", remaining_exponent=-1.0)
