"""Online throughput refit: NNLS against subset enumeration, exact recovery, convergence on synthetic steps."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.profiles.refit import OnlineThroughputFit, StepObservation, fit_step_times, nnls
from tests.factories import make_profile

P = 20_000_000
TRUTH = dict(alpha=0.004, beta=0.0006, intra=(5e-5, 2e-10), inter=(8e-4, 3e-9))


def true_time(k, c, s, h):
    lat, spp = TRUTH["intra"] if h == 1 else TRUTH["inter"]
    comm = 0.0 if k == 1 else 2 * (k - 1) * lat + 2 * (k - 1) / k * P * spp
    return s * (TRUTH["alpha"] + TRUTH["beta"] * c) + comm


def brute_nnls(a, y):
    """Best unconstrained least squares over every support whose solution is non-negative."""
    best, best_x = np.inf, np.zeros(a.shape[1])
    for r in range(a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), r):
            x = np.zeros(a.shape[1])
            if cols:
                x[list(cols)] = np.linalg.lstsq(a[:, cols], y, rcond=None)[0]
            if (x >= -1e-12).all():
                res = float(np.sum((a @ x - y) ** 2))
                if res < best - 1e-12:
                    best, best_x = res, x
    return best, best_x


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(3, 12), n=st.integers(1, 4))
def test_nnls_matches_subset_enumeration(seed, m, n):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n))
    y = rng.standard_normal(m)
    x = nnls(a, y)
    best, _ = brute_nnls(a, y)
    assert (x >= 0).all()
    assert float(np.sum((a @ x - y) ** 2)) == pytest.approx(best, rel=1e-7, abs=1e-10)


CONFIGS = [(k, c, s, h) for k in (1, 2, 4, 6, 8) for c in (8, 32, 64) for s in (1, 3) for h in ((1,) if k <= 4 else (2,))] + [
    (2, 32, 1, 2), (4, 16, 2, 2)]


def test_noise_free_steps_recover_every_coefficient():
    obs = [StepObservation(k, c, s, h, true_time(k, c, s, h)) for k, c, s, h in CONFIGS]
    fit = fit_step_times(obs, P)
    assert (fit.alpha, fit.beta) == (pytest.approx(TRUTH["alpha"], rel=1e-6), pytest.approx(TRUTH["beta"], rel=1e-6))
    assert (fit.intra.latency_s, fit.intra.seconds_per_param) == (pytest.approx(5e-5, rel=1e-5), pytest.approx(2e-10, rel=1e-6))
    assert (fit.inter.latency_s, fit.inter.seconds_per_param) == (pytest.approx(8e-4, rel=1e-5), pytest.approx(3e-9, rel=1e-6))
    prof = fit.to_profile("w", P, 64)
    assert prof.inter_host is not None and prof.iter_times_s[-1] == pytest.approx(TRUTH["alpha"] + 64 * TRUTH["beta"])


def test_refit_from_a_drifted_prior_converges_generation_by_generation():
    """Prior: a profile 25 % slow with no allreduce fit. Each generation (a new GPU count /
    hosts / batch, 15 steps with 5 % noise) is predicted before it runs, then added."""
    rng = np.random.default_rng(3)
    drifted = make_profile(num_params=P, overhead_s=TRUTH["alpha"] * 1.25, rate=1 / (TRUTH["beta"] * 1.25), cap=64,
                           latency_s=0.0, seconds_per_param=0.0)
    online = OnlineThroughputFit(P, prior=drifted)
    generations = [(1, 32, 1, 1), (2, 32, 1, 1), (4, 16, 2, 1), (8, 64, 1, 2), (6, 8, 3, 2), (4, 64, 1, 1), (8, 32, 2, 2)]
    errors = []
    for k, c, s, h in generations:
        fit = online.fit()
        probe = StepObservation(k, c, s, h, true_time(k, c, s, h))
        errors.append(abs(fit.predict(probe, P) / probe.seconds - 1))
        online.add(StepObservation(k, c, s, h, true_time(k, c, s, h) * rng.uniform(0.95, 1.05)) for _ in range(15))
    final = online.fit()
    grid = [abs(final.predict(StepObservation(k, c, s, h, 1.0), P) / true_time(k, c, s, h) - 1) for k, c, s, h in CONFIGS]
    assert errors[0] > 0.2  # the drifted prior mispredicts
    # measured: [0.25, 0.16, 0.24, 0.69, 0.18, 0.014, 0.0001] — the first inter-host generation
    # is unseen physics, the next one extrapolates from a single inter-host GPU count
    assert max(errors[-2:]) < 0.05 and max(grid) < 0.05


def test_bad_observations_name_the_field():
    with pytest.raises(ValueError, match="hosts"):
        StepObservation(2, 8, 1, 3, 0.1)
    with pytest.raises(ValueError, match="seconds"):
        StepObservation(2, 8, 1, 1, 0.0)
    with pytest.raises(ValueError, match="observations"):
        fit_step_times([], P)


def test_half_life_follows_a_machine_that_slows_down():
    """Every step takes 1.5x longer after the first 200 steps: a forgetting fit tracks the new speed."""
    rng = np.random.default_rng(11)
    configs = [(1, 32, 1, 1), (2, 32, 1, 1), (4, 16, 2, 1), (2, 64, 1, 1)]
    plain, forgetting = OnlineThroughputFit(P), OnlineThroughputFit(P, half_life=40)
    for i in range(400):
        k, c, s, h = configs[i % len(configs)]
        t = true_time(k, c, s, h) * (1.5 if i >= 200 else 1.0) * rng.uniform(0.97, 1.03)
        for fit in (plain, forgetting):
            fit.add([StepObservation(k, c, s, h, t)])
    probe = StepObservation(4, 32, 1, 1, 1.0)
    now = 1.5 * true_time(4, 32, 1, 1)
    assert forgetting.fit().predict(probe, P) == pytest.approx(now, rel=0.05)
    assert abs(plain.fit().predict(probe, P) / now - 1) > 0.1
    with pytest.raises(ValueError, match="half_life"):
        OnlineThroughputFit(P, half_life=0)


def test_a_drift_seen_at_one_gpu_count_is_shared_by_compute_and_allreduce():
    """A job seen only on 2 GPUs of one host, 30 % slower than its prior: the refit matches its
    step, and both the one-GPU compute and the allreduce rise (the prior's modelled multi-GPU
    points keep the allreduce terms from taking the whole drift, or none of it)."""
    p = 10_000_000
    prior = make_profile(num_params=p, overhead_s=0.005, rate=2000.0, cap=256, latency_s=1e-4, seconds_per_param=2e-9)
    compute = 0.005 + 32 / 2000  # the prior's one-GPU step at 32 samples, by hand
    comm = 2 * 1e-4 + 1 * p * 2e-9  # its ring allreduce on 2 GPUs: 2(k-1) lat + 2(k-1)/k p spp
    online = OnlineThroughputFit(p, prior=prior)
    online.add([StepObservation(2, 32, 1, 1, 1.3 * (compute + comm))] * 20)
    fit = online.fit()
    fitted_compute = fit.alpha + fit.beta * 32
    fitted_comm = fit.predict(StepObservation(2, 32, 1, 1, 1.0), p) - fitted_compute
    assert fitted_compute + fitted_comm == pytest.approx(1.3 * (compute + comm), rel=0.02)
    assert fitted_compute > 1.05 * compute and fitted_comm > 1.05 * comm


def test_a_job_seen_at_one_batch_keeps_its_priors_shape_scaled_by_its_drift():
    """Many steps at one micro-batch, 1.5x slower than the prior: the line's height there is
    measured, its shape (per-step overhead vs per-sample cost) is the prior's — so throughput
    still grows with the batch as it did. Oracle by hand: 1.5 x the prior's line."""
    prior = make_profile(num_params=P, overhead_s=0.0055, rate=1 / 0.00037, cap=128, latency_s=0.0, seconds_per_param=0.0)
    online = OnlineThroughputFit(P, prior=prior)
    online.add([StepObservation(1, 128, 1, 1, 1.5 * (0.0055 + 128 * 0.00037))] * 2000)
    fit = online.fit()
    assert online.drift() == pytest.approx(1.5, rel=1e-3)
    assert (fit.alpha, fit.beta) == (pytest.approx(1.5 * 0.0055, rel=0.02), pytest.approx(1.5 * 0.00037, rel=0.02))
    # What the policy compares: samples/s at batch 32 vs 128 keep the prior's ratio.
    ratio = (32 / (fit.alpha + 32 * fit.beta)) / (128 / (fit.alpha + 128 * fit.beta))
    assert ratio == pytest.approx((32 / (0.0055 + 32 * 0.00037)) / (128 / (0.0055 + 128 * 0.00037)), rel=0.02)


def test_steps_at_two_batches_override_the_priors_shape():
    """Seen at two micro-batches, the job's own line wins over the (scaled) prior's shape."""
    prior = make_profile(num_params=P, overhead_s=0.0055, rate=1 / 0.00037, cap=128, latency_s=0.0, seconds_per_param=0.0)
    online = OnlineThroughputFit(P, prior=prior)
    alpha, beta = 0.002, 0.0007  # another shape: less overhead, dearer samples
    online.add([StepObservation(1, c, 1, 1, alpha + beta * c) for c in (32, 128) for _ in range(500)])
    fit = online.fit()
    assert (fit.alpha, fit.beta) == (pytest.approx(alpha, rel=0.05), pytest.approx(beta, rel=0.02))


def test_long_tailed_steps_are_fitted_to_their_mean_which_is_what_a_jct_adds_up():
    """A rank sharing its core now and then: 1 step in 5 takes 3x as long. The fitted step is the
    steps' arithmetic mean (oracle: the mean of the drawn times), not the fast majority's."""
    rng = np.random.default_rng(5)
    base = {32: 0.004 + 32 * 0.0006, 128: 0.004 + 128 * 0.0006}
    online = OnlineThroughputFit(P)
    drawn: dict[int, list[float]] = {32: [], 128: []}
    for i in range(2000):
        c = 32 if i % 2 else 128
        t = base[c] * (3.0 if rng.random() < 0.2 else 1.0)
        drawn[c].append(t)
        online.add([StepObservation(1, c, 1, 1, t)])
    fit = online.fit()
    for c, times in drawn.items():
        assert fit.predict(StepObservation(1, c, 1, 1, 1.0), P) == pytest.approx(float(np.mean(times)), rel=0.01)
