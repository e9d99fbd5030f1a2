"""Seed-000 workloads: categories, arrival patterns, trace files (round trip and row/column errors)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.physics.throughput import baseline_rate
from allocator.workloads.arrivals import ArrivalSpec, arrival_times_min, base_rate_per_min, rate_segments
from allocator.workloads.seed000 import CATEGORIES, category, make_job
from allocator.workloads.trace import TraceError, read_trace, write_trace
from tests.sim_helpers import PROFILES, small_trace

NAMED = {f"cat{n}": p for n, p in PROFILES.items()}


def test_category_table_and_job_lengths():
    assert [c.single_gpu_minutes for c in CATEGORIES] == [16, 21, 41, 27]
    assert [(c.min_batch, c.max_batch) for c in CATEGORIES] == [(32, 256), (16, 256), (16, 1024), (128, 128)]
    for c in CATEGORIES:
        job = make_job("x", c, PROFILES[c.number], 0.0, 10)
        minutes = job.total_samples / baseline_rate(job) / 60
        assert minutes == pytest.approx(c.single_gpu_minutes, rel=1e-3)
        assert job.elastic == c.elastic
    food = make_job("f", category(4), PROFILES[4], 0.0, 10)
    assert not food.elastic and food.requested_gpus == food.max_gpus == 2  # 128 at 64 per GPU
    with pytest.raises(ValueError, match="category=9"):
        category(9)


def test_arrival_rates_follow_the_seed_definitions():
    lam = base_rate_per_min()
    assert lam == pytest.approx(1 / np.mean([16, 21, 41, 27]))
    high = rate_segments(ArrivalSpec("high", 100, kmax=10), lam)
    low = rate_segments(ArrivalSpec("low", 100, kmax=10), lam)
    assert high == [(0.0, 100, 10 * lam)] and low == [(0.0, 100, lam / 10)]
    bursty = rate_segments(ArrivalSpec("bursty", 240, kmax=10, period_min=60), lam)
    assert [s[2] for s in bursty] == [10 * lam, lam / 10, 10 * lam, lam / 10]


def test_poisson_counts_match_the_rate():
    rng = np.random.default_rng(0)
    counts = [len(arrival_times_min(ArrivalSpec("high", 600, kmax=10), rng)) for _ in range(30)]
    expected = 600 * 10 * base_rate_per_min()
    assert abs(np.mean(counts) - expected) < 4 * np.sqrt(expected / 30)


def test_same_seed_same_jobs():
    assert small_trace(5) == small_trace(5)
    assert small_trace(5) != small_trace(6)


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_trace_round_trip(fmt):
    jobs = small_trace(9)
    text = write_trace(jobs, fmt, NAMED)
    assert read_trace(text, fmt, NAMED) == jobs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name,submit_s,samples,min_batch,max_batch,max_gpus,category\na,0,100,16,64,4,1\nb,x,100,16,64,4,1\n", "row 2, column submit_s='x'"),
        ("name,submit_s,samples,min_batch,max_batch,max_gpus,category\na,0,100,16,64,4,1\nb,0,,16,64,4,1\n", "row 2, column samples: missing"),
        ("name,submit_s,samples,min_batch,max_batch,max_gpus,category\na,0,100,99,64,4,1\n", "row 1: job 'a'.min_batch=99"),
        ("name,submit_s,samples,min_batch,max_batch,max_gpus,category\na,0,100,16,64,4,7\n", "row 1, column profile='cat7'"),
        ("name,submit_s,samples,min_batch,max_batch,max_gpus,elastic,category\na,0,100,16,64,4,maybe,1\n", "row 1, column elastic='maybe'"),
        ("name,submit_s,samples,min_batch,max_batch,max_gpus,colour\na,0,100,16,64,4,red\n", "row 1, column colour: unknown"),
        ("name,submit_s,samples,min_batch,max_batch,max_gpus,category\na,0,100,16,64,4,1\na,1,100,16,64,4,1\n", "row 2, column name='a': duplicate"),
    ],
)
def test_bad_rows_name_row_and_column(text, message):
    with pytest.raises(TraceError) as err:
        read_trace(text, "csv", NAMED)
    assert message in str(err.value)


def test_bad_json_trace():
    with pytest.raises(TraceError, match="expected a JSON list"):
        read_trace('{"a": 1}', "json", NAMED)
    with pytest.raises(TraceError, match="row 1, column max_gpus"):
        read_trace('[{"name": "a", "submit_s": 0, "samples": 5, "min_batch": 1, "max_batch": 2, "category": 1}]', "json", NAMED)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), pattern=st.sampled_from(["low", "high", "bursty"]))
def test_generated_jobs_are_valid_and_ordered(seed, pattern):
    jobs = small_trace(seed, pattern=pattern, horizon_min=120, scale=2.0)
    times = [j.arrival_time for j in jobs]
    assert times == sorted(times) and all(0 <= t < 120 * 60 for t in times)
    assert len({j.id for j in jobs}) == len(jobs)
