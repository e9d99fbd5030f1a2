"""A rank's step records streamed to a file come back as they went in (issue 34: bounded bookkeeping)."""

from __future__ import annotations

import math
import tracemalloc

from elastic_tasks.protocol import StepRecord
from elastic_tasks.rank.accounting.step_history import StepHistory


def _records() -> list[StepRecord]:
    return [
        StepRecord(0, 2.5, 0.25, 2, 64, 0.1, 0.02, 0.001, 0.03),
        StepRecord(1, float("nan"), 0.0, 1, 7, 1e-3, noise_scale=math.inf, loss_samples=4, group_lrs=(0.1, 0.01, 3e-5)),
        StepRecord(2**40, -1.0, 1.0, 64, 2**20, 0.5, noise_scale=123.25, group_lrs=(0.5,)),
    ]


def test_records_read_back_equal_and_in_order() -> None:
    history = StepHistory()
    assert list(history) == [] and len(history) == 0
    want = _records()
    for r in want:
        history.append(r)
    got = list(history)
    assert len(history) == len(want) == len(got)
    assert math.isnan(got[1].loss)
    assert [r for r in got if r.step != 1] == [r for r in want if r.step != 1]
    assert got[1] == StepRecord(1, got[1].loss, 0.0, 1, 7, 1e-3, noise_scale=math.inf, loss_samples=4, group_lrs=(0.1, 0.01, 3e-5))
    history.append(want[0])  # reading did not end the stream
    assert list(history)[-1] == want[0] and len(list(history)) == 4


def test_appending_holds_no_memory_per_record() -> None:
    history = StepHistory()
    record = _records()[1]
    for _ in range(100):
        history.append(record)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(5_000):
            history.append(record)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Kept as objects, 5,000 records would hold > 1 MB; one write buffer is all that may remain.
    assert grown < 16_384, grown
    assert len(list(history)) == 5_100
