"""Goodput model: statistical efficiency, accumulation, hosts — each against an oracle written here."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.physics.goodput import NoiseTrajectory, efficiency, goodput_table
from allocator.policies import make_policy
from allocator.simulator.run import simulate
from allocator.physics.topology import fit_topology
from allocator.types import AllreduceModel, ClusterSnapshot
from tests.factories import make_job, make_profile


# -- oracles: t_proc(b) = overhead + b / rate exactly (make_profile's points are on that line) --


def own_step(overhead, rate, cap, params, lat, spp, batch, k, hosts=1, inter=None):
    """Seconds per optimizer step with the fewest accumulation steps that fit, or None."""
    s = math.ceil(batch / (k * cap))
    if batch < k * s:
        return None
    micro = math.ceil(batch / (k * s))
    a, b = (lat, spp) if hosts == 1 or inter is None else inter
    comm = 0.0 if k == 1 else 2 * (k - 1) * a + 2 * (k - 1) / k * params * b
    return s * (overhead + micro / rate) + comm, s


def own_goodput(job, k, noise, batch):
    """Base-batch samples per second: samples that reach the loss at B cost (1 + B/Bn) E_min
    (McCandlish et al.), so one sample at B is worth (1 + B0/Bn) / (1 + B/Bn) samples at B0."""
    p = job.profile
    got = own_step(p.iter_times_s[0] - p.batch_sizes[0] / RATE, RATE, p.max_batch_per_gpu, p.num_params,
                   p.allreduce.latency_s, p.allreduce.seconds_per_param, batch, k)
    if got is None:
        return 0.0, 1
    step, s = got
    b0 = job.fixed_batch or job.min_batch
    return batch / step * (1 + b0 / noise) / (1 + batch / noise), s


RATE = 2_000.0


def test_efficiency_is_the_samples_ratio_of_the_empirical_model():
    rng = np.random.default_rng(0)
    for _ in range(50):
        bn, b0, b = rng.uniform(1, 5000), rng.integers(1, 500), rng.integers(1, 5000)
        # samples(B) * E(B) = samples(B0) with samples(B) proportional to 1 + B / Bn
        assert (1 + b / bn) * efficiency(bn, b0, b) == pytest.approx(1 + b0 / bn)
    assert efficiency(math.inf, 32, 1024) == 1.0


jobs = st.builds(
    lambda cap, lo, span, noise, params: (make_job("j", make_profile(cap=cap, num_params=params, rate=RATE), min_batch=lo,
                                                   max_batch=lo + span, max_gpus=6), noise),
    cap=st.sampled_from([8, 16, 32, 64]),
    lo=st.integers(4, 64),
    span=st.integers(0, 300),
    noise=st.floats(5.0, 5000.0),
    params=st.integers(1_000_000, 50_000_000),
)


@settings(max_examples=40, deadline=None)
@given(case=jobs)
def test_goodput_table_picks_the_best_batch_by_enumeration(case):
    job, noise = case
    table = goodput_table(job, 6, noise)
    best = [max(own_goodput(job, k, noise, b)[0] for b in range(job.min_batch, job.max_batch + 1)) for k in range(1, 7)]
    expected = [g if g > 0 else -math.inf for g in best]  # no batch in range gives every rank a sample
    assert list(table.goodput[1:]) == pytest.approx(expected, rel=1e-9)
    chosen = [own_goodput(job, k, noise, int(table.batches[k])) for k in range(1, 7) if best[k - 1] > 0]
    assert [g for g, _ in chosen] == pytest.approx([g for g in best if g > 0], rel=1e-9)
    assert [s for _, s in chosen] == [int(table.accum[k]) for k in range(1, 7) if best[k - 1] > 0]


def test_noise_trajectory_pieces_and_validation():
    t = NoiseTrajectory.from_points([0.1, 0.5, 0.9], [100.0, 200.0, 400.0])
    assert t.bounds == (0.0, 0.3, 0.7, 1.0)
    assert [t.at(x) for x in (0.0, 0.29, 0.3, 0.69, 0.95, 1.0)] == [100.0, 100.0, 200.0, 200.0, 400.0, 400.0]
    with pytest.raises(ValueError, match="bounds"):
        NoiseTrajectory((0.0, 0.5), (1.0,))
    with pytest.raises(ValueError, match="values"):
        NoiseTrajectory((0.0, 1.0), (-3.0,))


def test_fixed_batch_job_keeps_its_gpus_and_accumulates():
    """A fixed batch of 600 on 2 GPUs with a cap of 64 runs 5 micro-steps of 60, not 10 GPUs."""
    prof = make_profile(cap=64, rate=RATE)
    job = make_job("big", prof, min_batch=600, max_batch=600, fixed_batch=600, max_gpus=16, requested_gpus=2, elastic=False,
                   total_samples=120_000)
    for name in ("fixed_batch", "elastic_dp"):
        alloc = make_policy(name).allocate(ClusterSnapshot(0.0, 16, queued=(job,)))
        assert (alloc["big"].gpus, alloc["big"].accum_steps, alloc["big"].batch_per_gpu) == (2, 5, 60)
    step, s = own_step(0.005, RATE, 64, prof.num_params, 1e-4, 1e-9, 600, 2)
    result = simulate([job], make_policy("fixed_batch"), 16)
    assert result.record("big").finish == pytest.approx(120_000 / 600 * step)


def test_lone_job_runs_at_its_goodput_optimum_in_the_goodput_simulator():
    from allocator.simulator.goodput_executor import simulate_goodput

    job = make_job("a", make_profile(rate=RATE), min_batch=32, max_batch=1024, max_gpus=4, total_samples=200_000)
    noise = {"w": NoiseTrajectory.constant(400.0)}
    result = simulate_goodput([job], make_policy("goodput_dp", noise=noise), 4, noise)
    best = max(own_goodput(job, k, 400.0, b)[0] for k in range(1, 5) for b in range(32, 1025))
    assert result.record("a").finish == pytest.approx(200_000 / best, rel=1e-9)


def test_goodput_simulator_integrates_a_changing_noise_scale():
    """Fixed share, B_noise 50 for the first 40 % of the work then 800: time = sum of piece / rate."""
    from allocator.simulator.goodput_executor import simulate_goodput

    job = make_job("a", make_profile(rate=RATE), min_batch=256, max_batch=256, fixed_batch=256, requested_gpus=2,
                   elastic=False, total_samples=100_000, max_gpus=2)
    traj = NoiseTrajectory((0.0, 0.4, 1.0), (50.0, 800.0))
    result = simulate_goodput([job], make_policy("fixed_batch"), 4, {"a": traj})
    step, _ = own_step(0.005, RATE, 256, 10_000_000, 1e-4, 1e-9, 256, 2)
    # E = 1 at the base batch: the trajectory must not matter for a job at B0
    assert result.record("a").finish == pytest.approx(100_000 / (256 / step))
    # B0 = min_batch = 64; the fixed-batch baseline runs the largest batch, 256, on its 2 GPUs
    bigger = make_job("b", make_profile(rate=RATE), min_batch=64, max_batch=256, requested_gpus=2, min_gpus=2,
                      total_samples=100_000, max_gpus=2)
    result = simulate_goodput([bigger], make_policy("fixed_batch"), 4, {"b": traj})
    e1, e2 = (50 + 64) / (50 + 256), (800 + 64) / (800 + 256)
    assert result.record("b").finish == pytest.approx(40_000 / (256 / step * e1) + 60_000 / (256 / step * e2))


def test_intra_and_inter_host_allreduce_fitted_separately():
    """Two 'hosts' of 4 workers: synthetic times from known coefficients plus 3 % noise."""
    rng = np.random.default_rng(7)
    intra, inter = (2e-5, 1e-10), (4e-4, 2e-9)
    rows = []
    for params in (1_000_000, 10_000_000, 50_000_000):
        for k in range(2, 9):
            hosts = 1 if k <= 4 else 2
            a, b = intra if hosts == 1 else inter
            t = 2 * (k - 1) * a + 2 * (k - 1) / k * params * b
            for _ in range(3):
                rows.append((params, k, hosts, t * rng.uniform(0.97, 1.03)))
        rows.append((params, 2, 2, (2 * inter[0] + params * inter[1]) * rng.uniform(0.97, 1.03)))
    got_intra, got_inter = fit_topology(rows)
    assert got_intra.seconds_per_param == pytest.approx(intra[1], rel=0.05)
    assert got_inter.seconds_per_param == pytest.approx(inter[1], rel=0.05)
    assert got_inter.latency_s == pytest.approx(inter[0], rel=0.3)
    with pytest.raises(ValueError, match="hosts"):
        fit_topology([(1000, 2, 3, 0.1)])


def test_policy_sees_the_inter_host_cost():
    """A communication-heavy job stays within one 4-GPU host when crossing hosts costs 20x."""
    prof = make_profile(rate=RATE, num_params=50_000_000)
    slow = type(prof)(**{f: getattr(prof, f) for f in prof.__slots__ if f != "inter_host"},
                      inter_host=AllreduceModel(latency_s=1e-3, seconds_per_param=2e-8))
    job = make_job("c", slow, min_batch=64, max_batch=512, max_gpus=8)
    flat = make_policy("goodput_dp", default_noise_scale=1000.0).allocate(ClusterSnapshot(0.0, 8, queued=(job,)))
    hosted = make_policy("goodput_dp", default_noise_scale=1000.0, hosts=4).allocate(
        ClusterSnapshot(0.0, 8, queued=(job,), nodes=(("h0", 4), ("h1", 4))))
    assert flat["c"].gpus > 4 and hosted["c"].gpus <= 4


def test_plan_keeps_a_fixed_batch_job_on_its_gpus_and_predicts_with_accumulation():
    from allocator.plan import make_plan

    prof = make_profile(cap=64, rate=RATE)
    job = make_job("big", prof, min_batch=600, max_batch=600, fixed_batch=600, max_gpus=32, requested_gpus=6, elastic=False,
                   total_samples=60_000)
    plan = make_plan([job], 32, make_policy("fixed_batch"))
    (planned,) = plan.jobs
    step, s = own_step(0.005, RATE, 64, prof.num_params, 1e-4, 1e-9, 600, 6)
    assert (planned.share.gpus, planned.share.accum_steps, s) == (6, 2, 2)
    assert planned.predicted_runtime_s == pytest.approx(60_000 / 600 * step)
