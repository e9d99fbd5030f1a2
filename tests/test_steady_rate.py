"""A configuration's measured samples/s is its steady rate: the global batch over the step-weighted
median step time of its timed intervals (``allocator.profiles.steady_rate``), fed from rank 0's status
reports through a job's refit (``JobRefit``). Oracles: the median taken from every step's time
written out one by one, and rates built into the reports the test makes."""

import math
import random

import pytest

from allocator.profiles.steady_rate import TimedInterval, median_step_s, steady_samples_per_s
from elastic_tasks.board import JobStatus
from elastic_tasks.coordinator.refit_watch import JobRefit, RefitSettings
from tests.factories import make_profile


def lower_median_of_each_step(intervals):
    """Every step's own time, written out, sorted; the lower median (index ceil(n/2) - 1)."""
    per_step = sorted(t for steps, seconds in intervals for t in [seconds / steps] * steps)
    return per_step[math.ceil(len(per_step) / 2) - 1]


def test_the_median_step_time_is_the_lower_median_of_every_step_written_out():
    rng = random.Random(26)
    for _ in range(200):
        raw = [(rng.randint(1, 12), rng.uniform(0.05, 3.0)) for _ in range(rng.randint(1, 9))]
        intervals = [TimedInterval(n, s) for n, s in raw]
        assert median_step_s(intervals) == pytest.approx(lower_median_of_each_step(raw), rel=1e-12)
    # By hand: 2 steps at 0.1 s, 5 at 0.2 s, 2 at 0.3 s: the 5th of 9 sorted steps is 0.2 s.
    assert median_step_s([TimedInterval(2, 0.2), TimedInterval(2, 0.6), TimedInterval(5, 1.0)]) == pytest.approx(0.2)
    assert steady_samples_per_s(256, [TimedInterval(4, 1.0)]) == pytest.approx(1024.0)
    assert median_step_s([]) is None and steady_samples_per_s(256, []) is None


@pytest.mark.parametrize(("steps", "seconds", "field"), [(0, 1.0, "steps"), (2, 0.0, "seconds"), (2, math.nan, "seconds"), (True, 1.0, "steps")])
def test_a_bad_interval_is_refused_naming_its_field(steps, seconds, field):
    with pytest.raises(ValueError, match=rf"TimedInterval\.{field}="):
        TimedInterval(steps, seconds)


def reports(version, intervals, world=2, batch=256, first_step=0, t0=1000.0):
    """Rank 0's status reports of one generation: one at ``first_step`` then one after each
    (steps, seconds per step) interval."""
    step, t = first_step, t0
    out = [JobStatus(version, step, step * batch, world, batch, 1.0, t)]
    for steps, per_step in intervals:
        step, t = step + steps, t + steps * per_step
        out.append(JobStatus(version, step, step * batch, world, batch, 1.0, t))
    return out


def feed(refit, statuses):
    for s in statuses:
        refit.observe(s, hosts=1)


# The growth scenario's shape: 2 x 256 at a steady 0.15 s a step, before and after a regroup.
STEADY_S, BATCH = 0.15, 256
WARMUP = 3


def test_cold_steps_and_load_bursts_after_a_regroup_do_not_move_a_generations_rate():
    refit = JobRefit(make_profile(cap=256), RefitSettings(warmup_steps=WARMUP))
    # Generation 0 (short, ~20 timed steps): first report at step 2, warm-up until step 5, then steady.
    first = [(3, 0.4)] + [(5, STEADY_S)] * 4
    feed(refit, reports(0, first, first_step=2))
    assert refit.generation_rate(2, BATCH) == pytest.approx(BATCH / STEADY_S)
    # Generation 1 (one rank) and generation 2 (2 x 256 again): its first 3 timed intervals
    # cold at 2x, one burst of other load at 4x, then 60 steady steps; the cold and slow
    # steps (3 x 5 + 5 = 20) are under half of the 80 timed.
    feed(refit, reports(1, [(5, 0.25)] * 4, world=1, first_step=30, t0=2000.0))
    cold = [(3, 0.5)] + [(5, 2 * STEADY_S)] * 3 + [(5, 4 * STEADY_S)] + [(5, STEADY_S)] * 12
    feed(refit, reports(2, cold, first_step=60, t0=3000.0))
    grown = refit.generation_rate(2, BATCH)
    assert grown == pytest.approx(BATCH / STEADY_S)
    # The oracle of the rule before: total samples over total seconds of the timed intervals
    # (those after the warm-up report): the same configuration "measured" 27 % slower.
    timed = cold[1:]
    mean_rate = BATCH * sum(n for n, _ in timed) / sum(n * s for n, s in timed)
    assert mean_rate / (BATCH / STEADY_S) == pytest.approx(80 / (15 * 2 + 5 * 4 + 60), rel=1e-9)
    assert mean_rate < 0.95 * grown
    # The job's table (what the trust rules compare): one entry for 2 x 256 over both generations.
    table = refit.measured()
    two = table.rate(2, BATCH, 1)
    assert two.samples_per_s == pytest.approx(BATCH / STEADY_S) and two.steps == 20 + 80
    assert table.rate(1, BATCH, 1).samples_per_s == pytest.approx(BATCH / 0.25)


def test_a_slower_steady_state_after_a_regroup_is_measured_as_slower():
    # Every step 15 % slower after the regroup (a trainer that lost something): the rule must show it.
    refit = JobRefit(make_profile(cap=256), RefitSettings(warmup_steps=WARMUP))
    feed(refit, reports(0, [(3, 0.4)] + [(5, STEADY_S)] * 8, first_step=2))
    before = refit.generation_rate(2, BATCH)
    feed(refit, reports(1, [(3, 0.4)] + [(5, 1.15 * STEADY_S)] * 8, first_step=60, t0=3000.0))
    after = refit.generation_rate(2, BATCH)
    assert after / before == pytest.approx(1 / 1.15)
    assert refit.generation_rate(1, BATCH) is None  # the latest generation ran 2 x 256, not 1 x 256
