"""The goodput table's one-candidate-per-block enumeration against every batch, enumerated here.

Wide ranges with many accumulation steps, hosts with their own allreduce fit, infinite noise
and pinned batches: the table must name, for every GPU count, the goodput of the best batch
in the whole range and (ties to the smaller) that batch.
"""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.physics.goodput import goodput_table
from allocator.types import AllreduceModel
from tests.factories import make_job, make_profile

RATE = 3_000.0
OVERHEAD = 0.004


def own_goodput(cap, params, intra, inter, per_host, noise, b0, batch, k):
    """Samples at B0 per second: B / (s t(c) + allreduce) x (Bn + B0) / (Bn + B), fewest steps s; 0 if a rank idles."""
    s = math.ceil(batch / (k * cap))
    if batch < k * s:
        return 0.0
    c = math.ceil(batch / (k * s))
    hosts = 1 if per_host is None else math.ceil(k / per_host)
    lat, spp = inter if hosts > 1 and inter is not None else intra
    comm = 0.0 if k == 1 else 2 * (k - 1) * lat + 2 * (k - 1) / k * params * spp
    worth = 1.0 if math.isinf(noise) else (noise + b0) / (noise + batch)
    return batch / (s * (OVERHEAD + c / RATE) + comm) * worth


cases = st.fixed_dictionaries(
    {
        "cap": st.sampled_from([1, 2, 3, 8, 32]),
        "lo": st.integers(1, 200),
        "span": st.integers(0, 1500),
        "noise": st.one_of(st.floats(1.0, 1e5), st.just(math.inf)),
        "params": st.integers(1_000_000, 100_000_000),
        "per_host": st.one_of(st.none(), st.integers(1, 4)),
        "inter": st.booleans(),
        "kmax": st.integers(1, 9),
        "pinned": st.integers(0, 5),
    }
)


@settings(max_examples=60, deadline=None)
@given(case=cases)
def test_table_matches_every_batch_enumerated(case):
    cap, lo, hi, kmax = case["cap"], case["lo"], case["lo"] + case["span"], case["kmax"]
    profile = make_profile(cap=cap, num_params=case["params"], rate=RATE, overhead_s=OVERHEAD, latency_s=2e-4, seconds_per_param=1e-10)
    inter = (1e-3, 8e-10) if case["inter"] else None
    if inter is not None:
        profile = dataclasses.replace(profile, inter_host=AllreduceModel(*inter))
    job = make_job("j", profile, min_batch=lo, max_batch=hi, max_gpus=kmax)
    pinned = lo + case["pinned"] * case["span"] // 5 if case["pinned"] else None  # mostly the whole range
    table = goodput_table(job, kmax, case["noise"], batch=pinned, gpus_per_host=case["per_host"])
    batches = [pinned] if pinned is not None else range(lo, hi + 1)
    intra = (2e-4, 1e-10)
    for k in range(1, kmax + 1):
        scored = [(own_goodput(cap, case["params"], intra, inter, case["per_host"], case["noise"], lo, b, k), b) for b in batches]
        best = max(g for g, _ in scored)
        if best <= 0:
            assert table.goodput[k] == -math.inf
            continue
        chosen = int(table.batches[k])
        assert table.goodput[k] == pytest.approx(best, rel=1e-12)
        assert own_goodput(cap, case["params"], intra, inter, case["per_host"], case["noise"], lo, chosen, k) == pytest.approx(best, rel=1e-12)
        assert int(table.accum[k]) == math.ceil(chosen / (k * cap))
        near = [b for g, b in scored if g >= best * (1 - 1e-9)]
        if len(near) == 1:  # a clear winner (equal-looking ones differ in the last bits: either may win)
            assert chosen == near[0]


def test_an_exact_tie_goes_to_the_smaller_batch():
    """Batch 16 in 2 micro-steps of 8 runs at exactly the speed of batch 8 in one (power-of-two
    scaling is exact in floating point): with no noise penalty the two tie, and 8 must win."""
    job = make_job("j", make_profile(cap=8, rate=RATE, overhead_s=OVERHEAD), min_batch=8, max_batch=16, max_gpus=1)
    table = goodput_table(job, 1, math.inf)
    assert own_goodput(8, job.profile.num_params, (0, 0), None, None, math.inf, 8, 16, 1) == own_goodput(8, job.profile.num_params, (0, 0), None, None, math.inf, 8, 8, 1)
    assert (int(table.batches[1]), int(table.accum[1])) == (8, 1)
