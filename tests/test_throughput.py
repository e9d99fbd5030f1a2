"""The seed-000 throughput model against values computed by hand from its formulas."""

import math

import numpy as np
import pytest

from allocator.physics.throughput import b_opt, baseline_rate, fit_allreduce, rate_table, t_comm, t_proc, throughput
from allocator.types import AllreduceModel, ThroughputProfile
from tests.factories import make_job

PROFILE = ThroughputProfile(
    workload="hand",
    num_params=1_000_000,
    batch_sizes=(8, 16, 32),
    iter_times_s=(0.10, 0.15, 0.25),
    max_batch_per_gpu=64,
    allreduce=AllreduceModel(latency_s=0.001, seconds_per_param=1e-8),
)


def test_t_proc_interpolates_and_extrapolates():
    assert t_proc(PROFILE, 16) == pytest.approx(0.15)
    assert t_proc(PROFILE, 12) == pytest.approx(0.125)  # halfway between 8 and 16
    assert t_proc(PROFILE, 48) == pytest.approx(0.25 + 16 * (0.10 / 16))  # last slope 0.1/16
    assert t_proc(PROFILE, 4) == pytest.approx(0.10 - 4 * (0.05 / 8))  # first slope, above proportional
    assert t_proc(PROFILE, 65) == math.inf  # beyond the memory cap


def test_t_comm_ring_formula():
    assert t_comm(PROFILE.allreduce, 1_000_000, 1) == 0.0
    # 2(k-1) latency + 2(k-1)/k * p * s: k=4 -> 6 * 0.001 + 1.5 * 0.01
    assert t_comm(PROFILE.allreduce, 1_000_000, 4) == pytest.approx(0.006 + 0.015)


def test_throughput_formula_by_hand():
    # b=48 on k=2: per GPU ceil(24)=24 -> t_proc = 0.15 + 8 * 0.1/16 = 0.2; t_comm = 2*0.001 + 1*0.01
    assert throughput(PROFILE, 48, 2) == pytest.approx(48 / (0.2 + 0.012))
    # b=33 on k=2: per GPU ceil(16.5)=17 (slowest rank decides)
    assert throughput(PROFILE, 33, 2) == pytest.approx(33 / (float(t_proc(PROFILE, 17)) + 0.012))
    assert throughput(PROFILE, 200, 2) == 0.0  # 100 per GPU does not fit


def test_b_opt_is_argmax_over_range():
    job = make_job("a", profile=PROFILE, min_batch=8, max_batch=100, max_gpus=4)
    for k in range(1, 5):
        best = b_opt(job, k)
        brute = max(range(max(8, k), 101), key=lambda b: (throughput(PROFILE, b, k), -b))
        assert throughput(PROFILE, best, k) == pytest.approx(throughput(PROFILE, brute, k))
    table = rate_table(job, 4)
    assert table.rates[0] == -np.inf and np.all(np.isfinite(table.rates[1:]))
    assert baseline_rate(job) == pytest.approx(64 / float(t_proc(PROFILE, 64)))


def test_rate_table_respects_gpu_limits_and_pinned_batch():
    job = make_job("a", profile=PROFILE, min_batch=8, max_batch=256, min_gpus=2, max_gpus=3)
    table = rate_table(job, 6)
    assert list(np.isfinite(table.rates)) == [False, False, True, True, False, False, False]
    pinned = rate_table(job, 6, batch=128)
    # 128 on 1 GPU exceeds the cap of 64; on 2 and 3 GPUs it fits.
    assert pinned.batches[2] == 128 and np.isfinite(pinned.rates[2]) and not np.isfinite(pinned.rates[1])


def test_fit_allreduce_recovers_coefficients():
    truth = AllreduceModel(latency_s=2e-4, seconds_per_param=3e-9)
    points = [(p, k, float(t_comm(truth, p, k))) for p in (1e6, 1e7, 5e7) for k in (1, 2, 4, 8)]
    fitted = fit_allreduce(points)
    assert fitted.latency_s == pytest.approx(2e-4, rel=1e-6)
    assert fitted.seconds_per_param == pytest.approx(3e-9, rel=1e-6)
    assert fit_allreduce([(1e6, 1, 0.1)]) == AllreduceModel()
    # Noise that would make the latency negative: it is clamped and the bandwidth refitted.
    noisy = fit_allreduce([(1e6, 2, 0.001), (1e7, 2, 0.0105), (1e6, 4, 0.0012)])
    assert noisy.latency_s >= 0 and noisy.seconds_per_param >= 0
