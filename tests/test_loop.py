"""The loop depends only on its Clock and Executor: drive it with a fake clock and a recorder."""

from dataclasses import dataclass, field

from allocator.loop import LoopSettings, run_loop
from allocator.policies import make_policy
from allocator.types import RescaleEvent, RescaleKind
from tests.factories import make_job


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep_until(self, t: float) -> None:
        self.sleeps.append(t)
        self.t = t


@dataclass
class RecordingExecutor:
    """Every job takes exactly ``duration`` seconds from its start, whatever its share."""

    duration: float
    calls: list[tuple[float, dict, dict]] = field(default_factory=list)
    started: dict[str, float] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)

    def apply(self, now, previous, new, jobs):
        self.calls.append((now, previous.as_dict(), new.as_dict()))
        events = []
        for job_id, share in new.shares:
            if job_id not in self.started:
                self.started[job_id] = now
                events.append(RescaleEvent(now, job_id, None, share, RescaleKind.START))
        return events

    def progress(self, job_id, now):
        return 0.0

    def completed(self, now):
        done = [j for j, t in self.started.items() if t + self.duration <= now and j not in self.reported]
        self.reported.update(done)
        return done

    def next_completion(self, now):
        pending = [t + self.duration for j, t in self.started.items() if j not in self.reported]
        return min(pending) if pending else None

    def failed(self, now):
        return []

    def in_effect(self, allocation):
        return allocation


def test_loop_with_fake_clock_and_recording_executor():
    jobs = [make_job("a", arrival_time=0.0), make_job("b", arrival_time=50.0), make_job("c", arrival_time=50.0)]
    clock, executor = FakeClock(), RecordingExecutor(duration=100.0)
    result = run_loop(jobs, make_policy("elastic_dp"), 2, clock, executor, LoopSettings(interval_s=30.0, react_to_events=False))
    # Decisions only on ticks (0, 30, 60, ...): b arrives at 50 and starts at 60; c waits for a GPU.
    assert executor.calls[0][0] == 0.0 and set(executor.calls[0][2]) == {"a"}
    assert result.record("b").start == 60.0
    assert result.record("a").finish == 100.0
    assert result.record("c").start == 120.0  # the first tick after a finished at 100
    assert result.record("c").finish == 220.0
    assert all(t2 >= t1 for t1, t2 in zip(clock.sleeps, clock.sleeps[1:]))
    assert [r.job_id for r in result.jobs] == ["a", "b", "c"]


def test_loop_reacts_to_events_when_asked():
    jobs = [make_job("a", arrival_time=0.0), make_job("b", arrival_time=50.0)]
    result = run_loop(jobs, make_policy("elastic_dp"), 2, FakeClock(), RecordingExecutor(100.0), LoopSettings(interval_s=1000.0, react_to_events=True))
    assert result.record("b").start == 50.0


def test_job_larger_than_the_cluster_is_dropped_not_queued_forever():
    big = make_job("big", min_gpus=4, max_gpus=4, requested_gpus=4)
    result = run_loop([big], make_policy("elastic_dp"), 2, FakeClock(), RecordingExecutor(10.0), LoopSettings())
    assert result.record("big").dropped and result.record("big").start is None
