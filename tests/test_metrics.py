"""Metrics against hand-computed values on tiny runs."""

import pytest

from allocator.loop import LoopResult, LoopSettings, JobRecord, ScheduleRow
from allocator.metrics import completed_over_time, gpu_seconds_by_job, schedule_csv, summarise, utilisation
from allocator.throughput import baseline_rate
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
    assert schedule_csv(result).splitlines()[:2] == ["time_s,job,gpus,batch", "0.000000,a,2,64"]
