"""The loop carries each running job's measured gradient noise scale from the executor to the policy."""

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


from allocator.physics.goodput import NoiseTrajectory, WorkMeter, raw_sample_budget
from allocator.loop import LoopSettings, run_loop
from allocator.policies import make_policy
from allocator.simulator.clock import SimClock
from allocator.simulator.executor import SimExecutor
from allocator.simulator.goodput_executor import GoodputSimExecutor, simulate_goodput
from allocator.types import Allocation, ClusterSnapshot
from tests.factories import make_job, make_profile


@dataclass
class Recording:
    """A policy that decides like ``inner`` and keeps what each snapshot said about running jobs
    (admission hands it the jobs it admits as running jobs without a share: those are left out)."""

    inner: object
    seen: list[tuple[float, str, float, float | None]] = field(default_factory=list)
    name: str = "recording"

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        self.seen += [(snapshot.time, r.spec.id, r.samples_done, r.noise_scale) for r in snapshot.running if r.share is not None]
        return self.inner.allocate(snapshot)

    def min_gpus(self, job, capacity):
        return self.inner.min_gpus(job, capacity)


def jobs():
    profile = make_profile(rate=2_000.0)
    return [
        make_job("a", profile, min_batch=32, max_batch=1024, max_gpus=4, total_samples=200_000),
        make_job("b", profile, min_batch=32, max_batch=512, max_gpus=4, total_samples=100_000, arrival_time=20.0),
        make_job("c", profile, min_batch=64, max_batch=1024, max_gpus=4, total_samples=150_000, arrival_time=45.0),
    ]


TRAJECTORY = NoiseTrajectory((0.0, 0.4, 1.0), (50.0, 800.0))


def own_noise(fraction):
    """TRAJECTORY read by hand: 50 before 40 % of the work, 800 from there on."""
    return 50.0 if fraction < 0.4 else 800.0


def test_the_snapshot_carries_what_the_executor_measured_and_nothing_otherwise():
    noise = {"w": TRAJECTORY}
    specs = {j.id: j for j in jobs()}
    settings = LoopSettings(interval_s=15.0)
    reporting = Recording(make_policy("goodput_dp", noise=noise))
    run_loop(jobs(), reporting, 4, SimClock(), GoodputSimExecutor(noise, report_noise=True), settings)
    running = reporting.seen
    assert len({jid for _, jid, _, _ in running}) == 3 and len(running) >= 5
    for _, jid, done, reported in running:
        assert reported == own_noise(done / specs[jid].total_samples)
    assert {r for *_, r in running} == {50.0, 800.0}  # both pieces were seen
    silent = Recording(make_policy("goodput_dp", noise=noise))
    run_loop(jobs(), silent, 4, SimClock(), GoodputSimExecutor(noise), settings)
    plain = Recording(make_policy("elastic_dp"))
    run_loop(jobs(), plain, 4, SimClock(), SimExecutor(), settings)
    assert silent.seen and plain.seen
    assert all(r is None for *_, r in silent.seen + plain.seen)


def test_a_policy_decides_on_the_reported_noise_scale_once_a_job_reports_one():
    # The truth rises from 50 to 800 at 40 % of the work. A policy that knows only the start (50
    # throughout) but hears each running job's report decides exactly as one that knows it all:
    # a job reports from its start on, and at admission both models say 50.
    noise = {"w": TRAJECTORY}
    settings = LoopSettings(interval_s=15.0)
    start_only = {"w": NoiseTrajectory.constant(50.0)}
    informed = simulate_goodput(jobs(), make_policy("goodput_dp", noise=noise), 4, noise, settings)
    told = simulate_goodput(jobs(), make_policy("goodput_dp", noise=start_only), 4, noise, settings, report_noise=True)
    blind = simulate_goodput(jobs(), make_policy("goodput_dp", noise=start_only), 4, noise, settings)
    assert told.schedule == informed.schedule and told.jobs == informed.jobs
    # Without the reports it keeps batches for B_noise 50 after the rise, and decides otherwise.
    assert blind.schedule != informed.schedule


# --- a real job's work in base-batch-equivalent samples (what the Dask executor counts) ---


def worth(noise, b0, batch):
    """McCandlish et al.: samples at B0 per sample at B for the same progress, (Bn + B0) / (Bn + B)."""
    return (noise + b0) / (noise + batch)


@settings(max_examples=200, deadline=None)
@given(
    generations=st.lists(st.tuples(st.integers(8, 128), st.integers(1, 40)), min_size=1, max_size=6),
    picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=20),
    noise=st.floats(1.0, 5_000.0),
)
def test_meter_counts_each_step_at_its_own_batch_from_sparse_reports(generations, picks, noise):
    job = make_job("m", min_batch=8, max_batch=128)
    # The trainer's counters after every step: (step, samples, batch of the generation it is in).
    after = []
    for batch, steps in generations:
        for _ in range(steps):
            last = after[-1] if after else (0, 0, batch)
            after.append((last[0] + 1, last[1] + batch, batch))
    # Reports come at arbitrary steps, but at least one inside every generation (so at most one
    # rescale lies between two reports, as with a poll much shorter than a generation).
    seen, first = set(), 0
    for _, steps in generations:
        seen.add(first + picks[first % len(picks)] % steps)
        first += steps
    seen |= {p % len(after) for p in picks}
    seen.add(len(after) - 1)
    meter = WorkMeter(job)
    for i in sorted(seen):
        step, samples, batch = after[i]
        meter.observe(step, samples, batch, noise)
        expected = sum(b * worth(noise, 8, b) for b, n in expand(generations)[: i + 1])
        assert meter.done == pytest.approx(expected, rel=1e-9)


def expand(generations):
    return [(batch, 1) for batch, steps in generations for _ in range(steps)]


def test_meter_takes_back_samples_a_resumed_job_lost_and_values_a_checkpoint_at_its_first_report():
    job = make_job("m", min_batch=16, max_batch=64)
    meter = WorkMeter(job)
    meter.observe(10, 640, 64, 48.0)  # resumed from a checkpoint 10 steps in
    assert meter.done == pytest.approx(640 * worth(48.0, 16, 64))
    meter.observe(6, 384, 64, 48.0)  # lost 4 steps: counted back at today's value
    assert meter.done == pytest.approx(384 * worth(48.0, 16, 64))
    meter.observe(6, 384, 64, 48.0)
    assert meter.done == pytest.approx(384 * worth(48.0, 16, 64))


@pytest.mark.parametrize("min_batch,max_batch,fixed", [(16, 256, None), (8, 100, None), (32, 512, 64), (10, 10, None)])
def test_raw_budget_covers_the_work_at_any_batch_and_noise_scale_and_is_tight(min_batch, max_batch, fixed):
    job = make_job("r", min_batch=min_batch, max_batch=max_batch, fixed_batch=fixed, total_samples=12_345)
    b0 = fixed if fixed is not None else min_batch
    budget = raw_sample_budget(job)
    for batch in range(min_batch, max_batch + 1):
        for noise in (1e-6, 0.5, 3.0, 50.0, 1e4, math.inf):
            e = 1.0 if math.isinf(noise) else worth(noise, b0, batch)
            assert 12_345 / e <= budget + 1e-6
    # Nearly noiseless at the largest batch, the work takes (almost) the whole budget.
    assert 12_345 / worth(1e-9, b0, max_batch) == pytest.approx(budget, abs=1.0)
