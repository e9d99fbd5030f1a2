"""A run a service scheduled, rebuilt from its store (``flows.recording.service_run``) and its jobs'
end values (``service.job_metrics``): a real sqlite store written through the store's own API,
figures checked against the timestamps the test put there (JCT, makespan, GPU-seconds by hand)."""

from __future__ import annotations

import pytest

from allocator.loop import LoopSettings
from allocator.metrics import summarise
from allocator.types import RescaleKind
from service.client import ServiceClient
from service.job_metrics import gpu_seconds, service_job_metrics
from service.store.records import AllocationRow, JobState
from service.store import JobStore
from tests.service_helpers import job_entry


@pytest.fixture
def store(tmp_path):
    s = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield s
    s.close()


def _run(store: JobStore):
    """Two jobs: a (submitted t=100, 2 GPUs at 101, shrunk to 1 at 105, done at 111) and b
    (submitted 104, 1 GPU at 105, failed at 108)."""
    client = ServiceClient(store, submitter="cluster-flow:jobs.yaml")
    a = client.submit(job_entry("a", samples=4000)).job_id
    b = client.submit(job_entry("b", samples=2000)).job_id
    store.update_job(a, submitted_at=100.0)
    store.update_job(b, submitted_at=104.0)
    store.set_state(a, JobState.RUNNING, started_at=101.0)
    store.record_allocations([AllocationRow(a, 101.0, 2, 64, "start")])
    store.set_state(b, JobState.RUNNING, started_at=105.0)
    store.record_allocations([AllocationRow(a, 105.0, 1, 32, "in_place"), AllocationRow(b, 105.0, 1, 32, "start")])
    store.set_state(b, JobState.FAILED, finished_at=108.0, error="job b: rank b-r0 failed: RuntimeError: boom")
    store.set_state(a, JobState.FINISHED, finished_at=111.0)
    rows = store.jobs(ids=[a, b])
    return {r.name: r for r in rows}, {r.id: store.allocations(r.id) for r in rows}


def test_the_store_rebuilds_the_loops_report_of_the_run(store):
    from flows.recording.service_run import loop_result_from_store

    rows, allocations = _run(store)
    result, specs, t0 = loop_result_from_store(list(rows.values()), allocations, capacity=2, settings=LoopSettings(interval_s=2.0))
    assert t0 == 100.0 and set(specs) == {"a", "b"}
    a, b = result.record("a"), result.record("b")
    assert (a.arrival, a.start, a.finish, a.failed) == (0.0, 1.0, 11.0, None)
    assert (b.arrival, b.start, b.finish) == (4.0, 5.0, None) and "boom" in b.failed
    assert result.end_time == 11.0 and result.capacity == 2
    # GPUs in use: 2 from t=1, still 2 (1 + 1) from t=5, 1 from t=8 (b's end), 0 from t=11.
    assert list(result.gpu_usage) == [(1.0, 2), (5.0, 2), (8.0, 1), (11.0, 0)]
    assert [(e.job_id, e.kind) for e in result.events] == [("a", RescaleKind.START), ("a", RescaleKind.IN_PLACE), ("b", RescaleKind.START)]
    metrics = summarise(result, specs)
    assert metrics.jobs_completed == 1 and metrics.avg_jct_s == 11.0 and metrics.makespan_s == 11.0 and metrics.rescales == 1
    # Used GPU-seconds: a 2x4 + 1x6 = 14, b 1x3 = 3 → 17 of 2 GPUs x 11 s.
    assert metrics.gpu_utilisation == pytest.approx(17 / 22)


def test_the_runs_size_is_the_services_when_known_and_the_rows_peak_when_not(store):
    """Rows that overlap for a moment (b's start stamped before a's end was) never make the
    service's 2 GPUs read as 3; an unknown size (0) is the rows' own peak."""
    from flows.recording.service_run import loop_result_from_store

    client = ServiceClient(store, submitter="cluster-flow:jobs.yaml")
    a = client.submit(job_entry("a", samples=4000)).job_id
    b = client.submit(job_entry("b", samples=2000)).job_id
    store.update_job(a, submitted_at=100.0)
    store.update_job(b, submitted_at=100.0)
    store.set_state(a, JobState.RUNNING, started_at=101.0)
    store.set_state(b, JobState.RUNNING, started_at=101.0)
    store.record_allocations([AllocationRow(a, 101.0, 2, 64, "start"), AllocationRow(b, 110.0, 1, 32, "start")])
    store.set_state(a, JobState.FINISHED, finished_at=111.0)
    store.set_state(b, JobState.FINISHED, finished_at=120.0)
    rows = store.jobs(ids=[a, b])
    allocations = {r.id: store.allocations(r.id) for r in rows}
    # Oracle by hand: a holds 2 from 1 to 11, b holds 1 from 10 to 20 → 3 in use from 10 to 11.
    peak = max(2 * (1 <= t < 11) + 1 * (10 <= t < 20) for t in range(0, 21))
    known, _, _ = loop_result_from_store(rows, allocations, capacity=2, settings=LoopSettings(interval_s=2.0))
    unknown, _, _ = loop_result_from_store(rows, allocations, capacity=0, settings=LoopSettings(interval_s=2.0))
    assert (known.capacity, unknown.capacity) == (2, peak) == (2, 3)


def test_a_service_jobs_end_values_match_a_malleable_run_jobs(store):
    rows, allocations = _run(store)
    a, b = rows["a"], rows["b"]
    assert gpu_seconds(allocations[a.id], end=111.0) == pytest.approx(2 * 4 + 1 * 6)
    values = service_job_metrics(a, allocations[a.id], result=None)
    assert values == {"rescales": 1.0, "gpu_seconds": 14.0, "jct_s": 11.0, "queue_delay_s": 1.0}
    failed = service_job_metrics(b, allocations[b.id], result=None)
    assert "jct_s" not in failed and failed["gpu_seconds"] == 3.0 and failed["rescales"] == 0.0
