"""Every second of a job accounted for (``allocator.wall_split``, ``elastic_tasks.rank.accounting.wall_split``):
a rank's timeline from a scripted clock, and the job's split composed from several ranks, against
sums worked out by hand in each test."""

from __future__ import annotations

import pytest

from allocator.wall_split import Phase, PhaseInterval, WallSplit, job_split
from elastic_tasks.rank.accounting.wall_split import MIN_NESTED_S, WallTimeline


class Ticks:
    """A clock the test moves: each read returns the current time."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_timeline_merges_steps_nests_phases_and_ignores_checks_that_found_nothing_to_do():
    clock = Ticks()
    wall = WallTimeline(clock)
    wall.record(Phase.START, 90.0, 100.0)
    for _ in range(3):  # three steps of 1 s, each with an evaluation check that takes no time
        with wall.phase(Phase.STEPS):
            clock.t += 0.6
            with wall.phase(Phase.EVALUATION):
                clock.t += MIN_NESTED_S / 2
            clock.t += 0.4 - MIN_NESTED_S / 2
    with wall.phase(Phase.CHECKPOINT):
        clock.t += 2.0
    with wall.phase(Phase.STEPS):  # a step with a real evaluation inside: 0.5 steps, 3 evaluation, 0.5 steps
        clock.t += 0.5
        with wall.phase(Phase.EVALUATION):
            clock.t += 3.0
        clock.t += 0.5
    got = [(iv.phase, round(iv.start, 6), round(iv.end, 6)) for iv in sorted(wall.snapshot(), key=lambda iv: iv.start)]
    assert got == [
        (Phase.START, 90.0, 100.0),
        (Phase.STEPS, 100.0, 103.0),  # the three steps, one interval
        (Phase.CHECKPOINT, 103.0, 105.0),
        (Phase.STEPS, 105.0, 105.5),
        (Phase.EVALUATION, 105.5, 108.5),
        (Phase.STEPS, 108.5, 109.0),
    ]


def test_a_jobs_split_takes_each_instant_once_steps_first_and_names_the_gaps():
    """Submitted at 0, started at 10 (queued 10 s), ranks begin at 12; rank r0 steps 12-50 with a
    checkpoint 30-32; rank r1 joins at 40 (start 40-42, state transfer 42-44, steps 44-50) and leaves;
    r0 waits 50-52 then steps 52-60; nobody covers 60-61; r0 evaluates 61-62; the loop notices the end at 63."""
    r0 = [
        PhaseInterval(Phase.START, 12.0, 14.0),
        PhaseInterval(Phase.STEPS, 14.0, 30.0),
        PhaseInterval(Phase.CHECKPOINT, 30.0, 32.0),
        PhaseInterval(Phase.STEPS, 32.0, 50.0),
        PhaseInterval(Phase.WAITING, 50.0, 52.0),
        PhaseInterval(Phase.STEPS, 52.0, 60.0),
        PhaseInterval(Phase.EVALUATION, 61.0, 62.0),
    ]
    r1 = [PhaseInterval(Phase.START, 40.0, 42.0), PhaseInterval(Phase.STATE_TRANSFER, 42.0, 44.0), PhaseInterval(Phase.STEPS, 44.0, 50.0)]
    split = job_split([r0, r1], start=10.0, end=63.0, submitted=0.0)
    # By hand: steps 14-30, 32-50, 52-60 = 16 + 18 + 8 = 42 (r1's steps overlap r0's);
    # checkpoint 30-32 = 2; evaluation 61-62 = 1; start: executor 10-12 + r0 12-14 = 4
    # (r1's start and transfer lie under r0's steps); waiting: queued 0-10, 50-52, end 62-63 = 13; gap 60-61 = 1.
    assert split == WallSplit(wall_s=63.0, steps_s=42.0, checkpoint_s=2.0, evaluation_s=1.0, start_s=4.0, waiting_s=13.0, unaccounted_s=1.0)
    assert split.unaccounted_pct == pytest.approx(100 / 63)
    parts = split.as_dict()
    assert sum(v for k, v in parts.items() if k != "wall_s") == pytest.approx(parts["wall_s"])
    assert WallSplit.from_dict(parts) == split


def test_a_job_without_timelines_is_start_then_waiting():
    split = job_split([], start=5.0, end=9.0, submitted=1.0)
    assert split == WallSplit(wall_s=8.0, start_s=4.0, waiting_s=4.0)  # queued 1-5; launched at 5, no rank ever began: start


def test_the_simulator_charges_checkpoint_writes_and_the_start_and_splits_them_like_a_real_job():
    """One job alone on 1 GPU at batch 64: t_step = 0.005 + 64/2000 = 0.037 s; a 0.2 s write every 10
    steps adds 0.02 s a step; 64,000 samples are 1,000 steps: 37 s of steps, 20 s of writes, plus
    a 3 s start; it arrives at 5 on an empty cluster, so it waits 0."""
    from allocator.loop import LoopSettings
    from allocator.policies import make_policy
    from allocator.simulator import RescaleCost, simulate
    from allocator.simulator.split import simulated_splits
    from tests.factories import make_job

    job = make_job("a", total_samples=64_000, min_batch=64, max_batch=64, max_gpus=1, arrival_time=5.0)
    cost = RescaleCost(start_s=3.0, checkpoint_s=0.2, checkpoint_every=10)
    result = simulate([job], make_policy("elastic_dp"), 1, LoopSettings(interval_s=1000.0), cost)
    record = result.record("a")
    steps, writes = 1000 * (0.005 + 64 / 2000), 100 * 0.2
    assert record.finish - record.start == pytest.approx(3.0 + steps + writes)
    split = simulated_splits(result, {"a": job}, cost)["a"]
    got = (split.wall_s, split.steps_s, split.checkpoint_s, split.start_s, split.regroup_s, split.waiting_s, split.unaccounted_s)
    assert got == pytest.approx((3.0 + steps + writes, steps, writes, 3.0, 0.0, 0.0, 0.0))
