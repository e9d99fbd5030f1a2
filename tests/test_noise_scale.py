"""Gradient noise scale estimator: synthetic gradients with a known noise scale, and the trainer's
cheap probe on linear regression, whose true noise scale the test derives in closed form
(one rank with accumulation, two and three gloo ranks, and an fp16-style overflow step)."""

import gc
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.rank.noise.scale import GradientNoiseProbe, NoiseScaleEstimator, NoiseTerms, noise_terms
from elastic_tasks.rank.noise.probe_schedule import SampleSchedule

D = 20
W_TRUE = np.linspace(-1.0, 1.0, D)
W_AT = W_TRUE + 0.5  # parameters are held here: the gradient distribution is stationary
NOISE = 0.3  # label noise
# The probe's estimate is an EMA of noisy per-step terms: after >= 400 samples at smoothing 0.995,
# its relative error from the truth stays well inside this (per-step cv ~ 1-2, n_eff ~ 400).
TOLERANCE = 0.2
# Steps of the multi-rank test: its two batch sizes differ by only 2-3x, so each sample's terms
# are noisier (cv ~ 3-5) than with accumulation; 3000 steps keep the EMA's error inside TOLERANCE.
RANK_STEPS = 3000


def test_two_batch_estimator_inverts_the_expected_norms():
    g2, tr = 3.0, 750.0
    got = noise_terms(g2 + tr / 8, 8, g2 + tr / 128, 128)
    assert (got.grad_sq, got.trace) == (pytest.approx(g2), pytest.approx(tr))
    with pytest.raises(ValueError, match="b_small"):
        noise_terms(1.0, 8, 1.0, 8)


def test_smoothed_estimate_of_synthetic_gradients_with_known_noise():
    """Per-sample gradients G + eps, eps ~ N(0, sigma^2 I_d): B_noise = d sigma^2 / |G|^2 = 200."""
    rng = np.random.default_rng(1)
    d, sigma = 50, 2.0
    g = np.full(d, math.sqrt(d * sigma**2 / 200.0 / d))
    est = NoiseScaleEstimator(smoothing=0.995)
    for _ in range(3000):
        per_sample = g + sigma * rng.standard_normal((64, d))
        small = per_sample[:16].mean(axis=0)
        est.update(noise_terms(float(small @ small), 16, float(per_sample.mean(0) @ per_sample.mean(0)), 64))
    assert est.value == pytest.approx(200.0, rel=0.1)
    assert NoiseScaleEstimator().value is None
    noisy = NoiseScaleEstimator()
    noisy.update(NoiseTerms(grad_sq=-1.0, trace=5.0))
    assert noisy.value == math.inf
    # A variance estimate that reads <= 0 (small batches, early) is "not measured yet", never
    # B_noise = 0: a zero would fail every snapshot's validation and stop the scheduler.
    quiet = NoiseScaleEstimator()
    quiet.update(NoiseTerms(grad_sq=2.0, trace=-0.5))
    assert quiet.value is None
    quiet.update(NoiseTerms(grad_sq=2.0, trace=3.0))
    assert quiet.value == pytest.approx((0.05 * -0.5 * 0.95 + 0.05 * 3.0) / (0.05 * 2.0 * 0.95 + 0.05 * 2.0))


def _draw(rng, n):
    x = rng.standard_normal((n, D))
    y = x @ W_TRUE + NOISE * rng.standard_normal(n)
    return x, y


def closed_form_noise_scale():
    """x ~ N(0, I_D), y = x.w* + s e, loss 0.5 (w.x - y)^2, held at w = w* + delta.

    Per-sample gradient g = r x with r = x.delta - s e. G = E[g] = E[x x^T] delta = delta.
    E|g|^2 = E[(x.delta)^2 |x|^2] + s^2 E|x|^2 = (D + 2)|delta|^2 + D s^2 (Gaussian fourth
    moments: E[x_i^2 x_j^2] = 1 + 2 [i = j]), so tr(Sigma) = E|g|^2 - |G|^2 = (D + 1)|delta|^2 + D s^2
    and B_noise = tr(Sigma) / |G|^2.
    """
    delta_sq = float(((W_AT - W_TRUE) ** 2).sum())
    return ((D + 1) * delta_sq + D * NOISE**2) / delta_sq


def _model():
    model = torch.nn.Linear(D, 1, bias=False)  # float32: the gradients' own dtype, as in training
    with torch.no_grad():
        model.weight.copy_(torch.tensor(W_AT, dtype=torch.float32)[None, :])
    return model


def _loss(model, x, y):
    return 0.5 * ((model(torch.tensor(x, dtype=torch.float32)).squeeze(1) - torch.tensor(y, dtype=torch.float32)) ** 2).mean()


def _accumulated_steps(probe, model, steps, batch=64, micro=16, scaler=None, overflow_at=None, seed=5):
    rng = np.random.default_rng(seed)
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        x, y = _draw(rng, batch)
        probe.begin_step(model, world=1, micro_batches=batch // micro)
        for a in range(0, batch, micro):
            # the trainer's scaling: mean loss x samples x world / global batch
            loss = _loss(model, x[a : a + micro], y[a : a + micro]) * (micro * 1 / batch)
            if step == overflow_at:
                loss = loss * float("inf")  # an fp16 overflow: every gradient turns inf/nan
            (scaler.scale(loss) if scaler is not None else loss).backward()
            probe.after_micro(model, micro, 1 / batch, world=1)
        probe.finish_step(model, batch, world=1, loss_scale=scaler._scale if scaler is not None else None)
    return probe.value


def test_cheap_probe_on_one_rank_with_accumulation_matches_the_closed_form():
    # No cost budget: this tiny model's step is so short that the budget would thin samples to
    # its cap; what is checked here is the estimate with the variance's N.
    probe = GradientNoiseProbe(smoothing=0.995, schedule=SampleSchedule(cost_budget=None))
    value = _accumulated_steps(probe, _model(), 3000)
    # Sampled every N steps, N from the estimate's variance: fewer samples than steps, still enough.
    assert 300 <= probe.estimator.updates < 3000 and probe.schedule.every > 1
    assert value == pytest.approx(closed_form_noise_scale(), rel=TOLERANCE)


def test_an_overflow_step_is_left_out_and_the_estimate_survives():
    """A GradScaler run whose one step overflows: the scaler skips it, and so does the probe;
    the estimate is finite before and after and still matches the closed form."""
    model = _model()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the parameters stay at W_AT
    probe = GradientNoiseProbe(smoothing=0.995, schedule=SampleSchedule(max_every=1, cost_budget=None))
    rng = np.random.default_rng(9)
    batch, micro = 64, 16
    for step in range(1500):
        opt.zero_grad(set_to_none=True)
        x, y = _draw(rng, batch)
        probe.begin_step(model, world=1, micro_batches=batch // micro)
        for a in range(0, batch, micro):
            loss = _loss(model, x[a : a + micro], y[a : a + micro]) * (micro / batch)
            if step == 700:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            probe.after_micro(model, micro, 1 / batch, world=1)
        value = probe.finish_step(model, batch, world=1, loss_scale=scaler._scale)
        scale_before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if step == 700:
            assert scaler.get_scale() < scale_before  # the scaler saw the overflow and skipped
        assert value is None or math.isfinite(value), (step, value)
    assert probe.skipped == 1
    assert probe.value == pytest.approx(closed_form_noise_scale(), rel=TOLERANCE)


def test_probe_without_a_second_batch_size_gives_no_estimate():
    model, probe, rng = _model(), GradientNoiseProbe(), np.random.default_rng(0)
    x, y = _draw(rng, 32)
    assert probe.begin_step(model, world=1, micro_batches=1) is False
    (_loss(model, x, y) * (32 / 32)).backward()
    probe.after_micro(model, 32, 1 / 32, world=1)
    assert probe.finish_step(model, 32, world=1) is None


def test_schedule_samples_rarely_when_the_terms_are_steady_and_every_step_when_noisy():
    steady, noisy = SampleSchedule(warmup=4), SampleSchedule(warmup=4)
    rng = np.random.default_rng(3)
    for _ in range(50):
        steady.observe(1.0 + 0.01 * rng.standard_normal(), 100.0 + rng.standard_normal(), 1.0, 100.0)
        noisy.observe(1.0 + 10 * rng.standard_normal(), 100.0 + 1000 * rng.standard_normal(), 1.0, 100.0)
    # cv^2 ~ 2e-4 -> N = floor(2000 * 0.1^2 / 2e-4) clamps at max_every; cv^2 ~ 200 -> N = floor(20 / 200) -> 1
    assert steady.every == steady.max_every and noisy.every == 1
    picks = [steady.due() for _ in range(4 * steady.max_every)]
    assert sum(picks) == 4


def test_cost_budget_thins_samples_to_keep_the_probe_within_its_share_of_the_step():
    """A probe that costs 5 % of a step's time, budget 1 %: every 5th step (5 / (0.01 * 100)),
    whatever the variance asks; a sampled step takes 105, the probe's 5 left out of the base."""
    schedule = SampleSchedule(cost_budget=0.01, warmup=0, max_every=1)
    schedule.observe(1.0, 1.0, 1.0, 1.0)  # a usable estimate: both averages positive
    sampled = 0
    for _ in range(400):
        due = schedule.due()
        sampled += due
        schedule.charge(5.0 if due else None, 100.0 + (5.0 if due else 0.0))
    assert schedule.every == 5
    # The first cost_warmup steps are sampled whatever they cost, then one step in five.
    warm = schedule.cost_warmup
    assert sampled == warm + (400 - warm) // 5
    assert schedule.probe_share == pytest.approx(5.0 / 5 / 100.0, rel=0.05)


def test_cost_budget_waits_for_a_usable_estimate_before_thinning():
    """Until B_noise first reads as a finite positive number every step is sampled (at most
    max_cost_warmup of them), however costly: a job gets an estimate as soon as it would without a budget."""
    schedule = SampleSchedule(cost_budget=0.01, max_cost_warmup=20)
    picks = []
    for step in range(60):
        due = schedule.due()
        picks.append(due)
        schedule.charge(50.0 if due else None, 150.0 if due else 100.0)  # the probe: half a step
        if due and step >= 9:  # from the 10th sample on, the averages are positive
            schedule.observe(1.0, 1.0, 1.0, 1.0)
    assert all(picks[:10])  # every step up to and including the first usable estimate
    assert sum(picks[10:]) <= 2  # then the budget: every 50th step at the least
    never = SampleSchedule(cost_budget=0.01, max_cost_warmup=20)
    never_picks = []
    for _ in range(60):
        due = never.due()
        never_picks.append(due)
        never.charge(50.0 if due else None, 150.0 if due else 100.0)
    assert all(never_picks[:20]) and sum(never_picks[20:]) <= 1  # no usable estimate: the budget after 20


def test_cost_budget_none_and_a_cheap_probe_leave_the_variance_rule_alone():
    free, cheap = SampleSchedule(cost_budget=None), SampleSchedule(cost_budget=0.01)
    for schedule in (free, cheap):
        for _ in range(50):
            schedule.charge(0.001 if schedule.due() else None, 1.0)  # the probe: 0.1 % of the step
    assert free.every == 1 and cheap.every == 1


def test_probe_times_its_own_work_on_sampled_steps_only():
    """With a clock the test moves, the probe's charge is what passed inside its own calls."""
    charged: list[tuple[float | None, float]] = []

    class Recording(SampleSchedule):
        def charge(self, probe_s: float | None, step_s: float) -> None:
            charged.append((probe_s, step_s))
            super().charge(probe_s, step_s)

    now = [0.0]
    model, rng = _model(), np.random.default_rng(1)
    probe = GradientNoiseProbe(schedule=Recording(cost_budget=0.5), clock=lambda: now[0])
    for _ in range(3):
        x, y = _draw(rng, 32)
        sampled = probe.begin_step(model, world=1, micro_batches=2)
        for a in (0, 16):
            (_loss(model, x[a : a + 16], y[a : a + 16]) * 0.5).backward()
            now[0] += 10.0  # the step's own work
            probe.after_micro(model, 16, 1 / 32, world=1)
        probe.finish_step(model, 32, world=1)
        assert sampled
    # The clock never moved inside the probe's calls: a sampled step charges 0, the step 20.
    assert charged == [(0.0, 20.0), (0.0, 20.0)]


def _rank(rank, world, init_file, out_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = _model()
    ddp = DistributedDataParallel(model)
    # No cost budget: on this tiny model it would thin samples to its cap (test_cost_budget_*
    # covers the budget); this checks the cross-rank estimate itself.
    probe = GradientNoiseProbe(smoothing=0.995, schedule=SampleSchedule(cost_budget=None))
    rng = np.random.default_rng(100 + rank)
    batch = 32 * world
    for _ in range(RANK_STEPS):
        model.zero_grad(set_to_none=True)
        x, y = _draw(rng, 32)
        probe.begin_step(model, world, micro_batches=1)
        (_loss(ddp, x, y) * (32 * world / batch)).backward()
        probe.after_micro(model, 32, world / batch, world)
        probe.finish_step(model, batch, world)
    if rank == 0:
        with open(out_file, "w") as fh:
            fh.write(repr((probe.value, probe.estimator.updates)))
    # Both ranks done before either tears gloo down: a rank that closes its pairs while its peer
    # still finishes the last step makes the peer's gloo abort (SIGABRT, seen in a CI run).
    dist.barrier()
    del ddp, probe
    gc.collect()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_cheap_probe_across_gloo_ranks_matches_the_closed_form(tmp_path, world):
    """The local gradient is read by read-only parameter hooks, DDP's allreduce untouched."""
    out = tmp_path / "value"
    # Forked from one forkserver that imported torch, DDP's torch._dynamo (imported by its
    # constructor) and this module once: spawned, each rank spent ~3.5 s CPU importing them.
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed", __name__])
    mp.start_processes(_rank, args=(world, str(tmp_path / "init"), str(out)), nprocs=world, join=True, start_method="forkserver")
    value, updates = eval(out.read_text())  # noqa: S307 - the repr of a (float, int) the test wrote
    assert 100 <= updates <= RANK_STEPS
    assert value == pytest.approx(closed_form_noise_scale(), rel=TOLERANCE)
