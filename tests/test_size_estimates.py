"""A policy robust to declared sizes (issue 38): what it believes is left, a size-oblivious mode
that really ignores declared sizes, and a simulator that runs a job's true work."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.admission import OverflowMode, reallocate
from allocator.loop import LoopSettings
from allocator.physics.noise import NoiseTrajectory
from allocator.policies import make_policy
from allocator.policies.remaining import expected_remaining
from allocator.simulator import RescaleCost, simulate
from allocator.types import ClusterSnapshot, InfeasibleError, RunningJob, SizeKnowledge
from tests.factories import make_job
from tests.strategies import snapshots_with_running


def log_uniform_residual(declared: float, done: float, spread: float) -> float:
    """E[S - d | S > d] for S log-uniform on [D / spread, D * spread], by quadrature on a fine log grid."""
    s = np.exp(np.linspace(math.log(declared / spread), math.log(declared * spread), 200_001))
    weight = np.where(s > done, 1.0, 0.0)  # density 1/s on a log grid is uniform: each point weighs the same
    if weight.sum() == 0:
        return math.nan
    return float((s * weight).sum() / weight.sum() - done)


@settings(max_examples=60, deadline=None)
@given(declared=st.floats(1e3, 1e9), fraction=st.floats(0.0, 1.99), spread=st.sampled_from([1.5, 2.0, 4.0]))
def test_an_estimate_is_read_as_a_prior_conditioned_on_progress(declared, fraction, spread):
    done = fraction * declared
    got = expected_remaining(declared, done, SizeKnowledge.ESTIMATE, spread)
    if done < declared * spread * 0.999:
        assert got == pytest.approx(log_uniform_residual(declared, done, spread), rel=2e-3, abs=declared * 1e-4)
    assert expected_remaining(declared, done, SizeKnowledge.EXACT) == pytest.approx(max(declared - done, 0.0))


def test_past_every_estimate_a_job_counts_by_its_attained_service():
    """A job past D * spread is not 'nearly done' for ever: it expects as long again as it has run."""
    assert expected_remaining(1000.0, 2500.0, SizeKnowledge.ESTIMATE, 2.0) == 2500.0
    assert expected_remaining(1000.0, 2500.0, SizeKnowledge.EXACT) == 0.0
    assert expected_remaining(1000.0, 10.0, SizeKnowledge.UNKNOWN, floor=50.0) == 50.0
    assert expected_remaining(1000.0, 80.0, SizeKnowledge.UNKNOWN, floor=50.0) == 80.0


def _reporting(snapshot: ClusterSnapshot, seed: int) -> ClusterSnapshot:
    """Every running job reports a noise scale, as trainers (and the simulator) do."""
    rng = np.random.default_rng(seed)
    running = tuple(dataclasses.replace(r, noise_scale=float(rng.uniform(50, 5000))) for r in snapshot.running)
    return dataclasses.replace(snapshot, running=running)


def _resized(snapshot: ClusterSnapshot, factors: list[float]) -> ClusterSnapshot:
    """The same jobs declaring other sizes (progress unchanged)."""
    jobs = list(snapshot.running) + list(snapshot.queued)
    scale = [max(1, int(j.spec.total_samples * f)) if isinstance(j, RunningJob) else max(1, int(j.total_samples * f)) for j, f in zip(jobs, factors)]
    running = tuple(dataclasses.replace(r, spec=dataclasses.replace(r.spec, total_samples=n)) for r, n in zip(snapshot.running, scale))
    queued = tuple(dataclasses.replace(q, total_samples=n) for q, n in zip(snapshot.queued, scale[len(snapshot.running) :]))
    return dataclasses.replace(snapshot, running=running, queued=queued)


@settings(max_examples=80, deadline=None)
@given(snap=snapshots_with_running(), factors=st.lists(st.floats(0.1, 10.0), min_size=8, max_size=8), seed=st.integers(0, 2**16))
def test_the_size_oblivious_mode_never_reads_a_declared_size(snap, factors, seed):
    """With sizes=ignore the same jobs declaring any other sizes get the same admission and allocation."""
    policy = make_policy("goodput_dp", sizes="ignore", default_noise_scale=800.0)
    base = _reporting(snap, seed)
    other = _resized(base, factors)
    try:
        first = reallocate(base, policy, OverflowMode.QUEUE)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            reallocate(other, policy, OverflowMode.QUEUE)
        return
    second = reallocate(other, policy, OverflowMode.QUEUE)
    assert [j.id for j in second.admission.admitted] == [j.id for j in first.admission.admitted]
    assert second.allocation == first.allocation


@settings(max_examples=40, deadline=None)
@given(snap=snapshots_with_running(), seed=st.integers(0, 2**16))
def test_marking_every_job_an_estimate_is_the_policy_reading_every_size_as_one(snap, seed):
    base = _reporting(snap, seed)
    marked = dataclasses.replace(
        base,
        running=tuple(dataclasses.replace(r, spec=dataclasses.replace(r.spec, size=SizeKnowledge.ESTIMATE)) for r in base.running),
        queued=tuple(dataclasses.replace(q, size=SizeKnowledge.ESTIMATE) for q in base.queued),
    )
    by_job = make_policy("goodput_dp", default_noise_scale=800.0)
    by_policy = make_policy("goodput_dp", sizes="estimate", default_noise_scale=800.0)
    try:
        expected = reallocate(marked, by_job, OverflowMode.QUEUE).allocation
    except InfeasibleError:
        return
    assert reallocate(base, by_policy, OverflowMode.QUEUE).allocation == expected


def test_a_simulated_job_does_its_true_work_whatever_it_declared():
    """Two jobs declaring half and twice their work finish when their true work is done."""
    noise = NoiseTrajectory((0.0, 0.5, 1.0), (200.0, 2000.0))
    jobs = [
        make_job("under", total_samples=50_000, min_batch=32, max_batch=256, max_gpus=2, noise_scale=noise, actual_samples=100_000, size=SizeKnowledge.ESTIMATE),
        make_job("over", total_samples=200_000, min_batch=32, max_batch=256, max_gpus=2, noise_scale=noise, actual_samples=100_000, size=SizeKnowledge.ESTIMATE),
        make_job("exact", total_samples=100_000, min_batch=32, max_batch=256, max_gpus=2, noise_scale=noise),
    ]
    result = simulate(jobs, make_policy("goodput_dp"), 6, LoopSettings(interval_s=30.0), RescaleCost())
    records = {r.job_id: r for r in result.jobs}
    assert all(r.finish is not None for r in records.values())
    assert {k: r.samples_done for k, r in records.items()} == {"under": 100_000.0, "over": 100_000.0, "exact": 100_000.0}
    # Alone on two GPUs each, with the same true work and trajectory, the three run alike.
    spans = [r.finish - r.start for r in records.values()]
    assert max(spans) == pytest.approx(min(spans), rel=1e-6)
