"""Metrics against hand-computed values on tiny runs."""

from dataclasses import replace

import pytest

from allocator.loop import LoopResult, LoopSettings, JobRecord, ScheduleRow
from allocator.metrics import completed_over_time, gpu_seconds_by_job, read_schedule_csv, schedule_csv, summarise, utilisation
from allocator.physics.throughput import baseline_rate
from allocator.types import RescaleEvent, RescaleKind, Share
from tests.factories import make_job


def _result():
    # a: 2 GPUs from 0 to 10, 4 GPUs from 10 to 20 (finishes); b: arrives 5, starts 10 on 1 GPU, dropped? no: finishes 30.
    schedule = (
        ScheduleRow(0.0, "a", 2, 64),
        ScheduleRow(10.0, "a", 4, 128),
        ScheduleRow(10.0, "b", 1, 32),
        ScheduleRow(20.0, "a", 0, 0),
        ScheduleRow(30.0, "b", 0, 0),
    )
    jobs = (
        JobRecord("a", 0.0, 0.0, 20.0, False, 1000.0),
        JobRecord("b", 5.0, 10.0, 30.0, False, 500.0),
        JobRecord("c", 6.0, None, None, True, 0.0),
    )
    events = (RescaleEvent(10.0, "a", Share(2, 64), Share(4, 128), RescaleKind.IN_PLACE, cost_s=1.5),)
    usage = ((0.0, 2), (10.0, 5), (20.0, 1), (30.0, 0))
    return LoopResult("p", 8, LoopSettings(), 30.0, schedule, events, jobs, usage, 3)


def test_hand_computed_metrics():
    a = make_job("a", total_samples=1000)
    b = make_job("b", total_samples=500)
    c = make_job("c")
    result = _result()
    assert gpu_seconds_by_job(result) == {"a": 2 * 10 + 4 * 10, "b": 20.0}
    assert utilisation(result) == pytest.approx((2 * 10 + 5 * 10 + 1 * 10) / (30 * 8))
    m = summarise(result, {"a": a, "b": b, "c": c})
    opt = 1000 / baseline_rate(a) + 500 / baseline_rate(b)
    assert m.sjs_efficiency == pytest.approx(opt / 80.0)
    assert m.drop_ratio == pytest.approx(1 / 3)
    assert m.avg_jct_s == pytest.approx((20 + 25) / 2)
    assert m.avg_queue_delay_s == pytest.approx((0 + 5) / 2)
    assert m.rescales == 1 and m.rescale_cost_s == 1.5
    times, counts = completed_over_time(result)
    assert list(times) == [20.0, 30.0] and list(counts) == [1, 2]
    assert schedule_csv(result).splitlines()[:2] == ["time_s,job,gpus,batch,accum_steps", "0.000000,a,2,64,1"]


def test_schedule_csv_round_trips_with_accumulation_and_old_files_read_as_one_step():
    rows = (ScheduleRow(0.0, "a", 2, 1024, 4), ScheduleRow(12.5, "b", 1, 32), ScheduleRow(30.0, "a", 0, 0))
    result = LoopResult("p", 8, LoopSettings(), 30.0, rows, (), (), (), 1)
    text = schedule_csv(result)
    assert text.splitlines() == ["time_s,job,gpus,batch,accum_steps", "0.000000,a,2,1024,4", "12.500000,b,1,32,1", "30.000000,a,0,0,1"]
    assert read_schedule_csv(text) == rows
    old = "time_s,job,gpus,batch\n0.000000,a,2,1024\n30.000000,a,0,0\n"  # written before accum_steps
    assert read_schedule_csv(old) == (ScheduleRow(0.0, "a", 2, 1024, 1), ScheduleRow(30.0, "a", 0, 0, 1))
    for bad, says in [("", "empty"), ("t,job\n", "header"), ("time_s,job,gpus,batch\n1,a,2\n", "row 1"), ("time_s,job,gpus,batch\n1,a,x,2\n", "integers")]:
        with pytest.raises(ValueError, match=says):
            read_schedule_csv(bad)


def test_the_loop_records_the_accumulation_steps_a_policy_gives():
    from allocator.policies import make_policy
    from allocator.simulator.run import simulate
    from tests.factories import make_profile

    # A fixed batch of 1024 on its 2 GPUs with 256 samples per GPU at most: ceil(1024 / 512) = 2 micro-steps.
    job = make_job("big", make_profile(cap=256), min_batch=1024, max_batch=1024, fixed_batch=1024, elastic=False,
                   requested_gpus=2, max_gpus=2, total_samples=50_000)
    result = simulate([job], make_policy("fixed_batch"), 4)
    assert [(r.gpus, r.batch, r.accum_steps) for r in result.schedule] == [(2, 1024, 2), (0, 0, 1)]
    # The file keeps microseconds.
    assert read_schedule_csv(schedule_csv(result)) == tuple(replace(r, time=round(r.time, 6)) for r in result.schedule)
