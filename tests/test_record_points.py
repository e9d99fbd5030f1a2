"""A run's recorded per-job metrics follow the share's gradient accumulation (flows.recording.record)."""

import pytest

from allocator.loop import LoopResult, LoopSettings, ScheduleRow
from flows.recording.record import schedule_points
from tests.factories import make_job, make_profile


def own_rate(batch, gpus, accum):
    """make_profile's model by hand: t_proc(b) = 0.005 + b / 2000 (measured at powers of two, so
    exact there), ring allreduce 2 (k-1) 1e-4 + 2 (k-1)/k 1e7 1e-9, one per optimizer step."""
    micro = -(-batch // (gpus * accum))
    comm = 2 * (gpus - 1) * 1e-4 + 2 * (gpus - 1) / gpus * 1e7 * 1e-9
    return batch / (accum * (0.005 + micro / 2000) + comm)


def test_recorded_micro_batch_accumulation_and_modelled_rate_follow_the_share():
    job = make_job("a", make_profile(cap=256), min_batch=64, max_batch=2048)
    rows = (ScheduleRow(0.0, "a", 2, 1024, 2), ScheduleRow(10.0, "a", 4, 512), ScheduleRow(20.0, "a", 1, 2048, 8), ScheduleRow(30.0, "a", 0, 0))
    result = LoopResult("p", 4, LoopSettings(), 30.0, rows, (), (), (), 1)
    points = schedule_points(result, job, start_ms=1_000)
    by_name = {}
    for p in points:
        by_name.setdefault(p.key, []).append((p.step, p.value))
    assert by_name["accum_steps"] == [(0, 2), (10, 1), (20, 8), (30, 0)]
    assert by_name["batch_per_gpu"] == [(0, 256), (10, 128), (20, 256), (30, 0)]
    rates = [v for _, v in by_name["modelled_samples_per_s"]]
    assert rates == pytest.approx([own_rate(1024, 2, 2), own_rate(512, 4, 1), own_rate(2048, 1, 8), 0.0], rel=1e-12)
    # Not the rate of the same batch in one step, which ignoring accumulation would model.
    assert rates[0] != pytest.approx(own_rate(1024, 2, 1), rel=1e-3)
