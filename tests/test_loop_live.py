"""The loop fed live (a service's jobs): arrivals in order, cancellations, failures, capacity that
changes, a stop. Driven by a fake clock, a scripted feed and an executor that only records."""

from dataclasses import dataclass, field

from allocator.loop.execution import JobFailure, share_changes
from allocator.loop.lifecycle import JobState
from allocator.loop import LoopSettings, run_loop
from allocator.policies import make_policy
from allocator.loop.sources import Arrivals
from allocator.types import Allocation, RescaleEvent, RescaleKind, Share
from tests.factories import make_job
from tests.test_loop import FakeClock


class ScriptedFeed:
    """Gives ``script[t]`` at the first poll at or after ``t``; looks again every ``poll_s``."""

    def __init__(self, script: dict[float, Arrivals], poll_s: float = 1.0) -> None:
        self.script, self.poll_s = dict(script), poll_s

    def poll(self, now):
        due = sorted(t for t in self.script if t <= now)
        found = [self.script.pop(t) for t in due]
        return Arrivals(
            jobs=tuple(j for a in found for j in a.jobs),
            cancelled=tuple(c for a in found for c in a.cancelled),
            stop=any(a.stop for a in found),
        )

    def next_arrival(self, now):
        return now + self.poll_s


@dataclass
class ScriptedExecutor:
    """Jobs never finish by themselves; ``fail_at`` makes one fail at a time; records every change."""

    fail_at: dict[str, float] = field(default_factory=dict)
    stops: list[tuple[float, str]] = field(default_factory=list)
    starts: list[tuple[float, str, int]] = field(default_factory=list)
    live: set[str] = field(default_factory=set)

    def apply(self, now, previous, new, jobs):
        events = []
        for job_id, before, after in share_changes(previous, new):
            if after is None:
                self.stops.append((now, job_id))
                self.live.discard(job_id)
                events.append(RescaleEvent(now, job_id, before, None, RescaleKind.STOP))
            elif before is None:
                self.starts.append((now, job_id, after.gpus))
                self.live.add(job_id)
                events.append(RescaleEvent(now, job_id, None, after, RescaleKind.START))
        return events

    def progress(self, job_id, now):
        return 0.0

    def completed(self, now):
        return []

    def next_completion(self, now):
        return now + 1.0 if self.live else None

    def failed(self, now):
        due = [j for j, t in self.fail_at.items() if t <= now and j in self.live]
        for j in due:
            self.live.discard(j)
            del self.fail_at[j]
        return [JobFailure(j, "rank 0 raised RuntimeError: boom") for j in due]

    def in_effect(self, allocation):
        return allocation


def one_gpu_job(job_id, **kw):
    return make_job(job_id, max_gpus=1, min_batch=16, max_batch=16, **kw)


def test_live_feed_cancellation_failure_and_stop_are_each_seen_once():
    feed = ScriptedFeed(
        {
            0.0: Arrivals(jobs=(one_gpu_job("a"), one_gpu_job("b"), one_gpu_job("c"))),
            3.0: Arrivals(cancelled=("b", "c", "nobody")),  # b runs, c waits, "nobody" is unknown
            4.0: Arrivals(jobs=(one_gpu_job("d"),)),
            9.0: Arrivals(stop=True),
        }
    )
    executor = ScriptedExecutor(fail_at={"a": 6.0})
    phases = []
    result = run_loop(feed, make_policy("elastic_dp"), 2, FakeClock(), executor, LoopSettings(interval_s=100.0), on_job=phases.append)

    # Two GPUs: a and b start at 0, c waits; cancelling b stops it and lets d start at 4 when it
    # arrives; a fails at 6 and nothing else is left to start; the stop ends the loop at 9.
    assert executor.starts == [(0.0, "a", 1), (0.0, "b", 1), (4.0, "d", 1)]
    assert executor.stops == [(3.0, "b")]
    by_job = {}
    for t in phases:
        by_job.setdefault(t.job_id, []).append((t.time, t.phase))
    assert by_job["a"] == [(0.0, JobState.QUEUED), (0.0, JobState.RUNNING), (6.0, JobState.FAILED)]
    assert by_job["b"] == [(0.0, JobState.QUEUED), (0.0, JobState.RUNNING), (3.0, JobState.CANCELLED)]
    assert by_job["c"] == [(0.0, JobState.QUEUED), (3.0, JobState.CANCELLED)]
    assert by_job["d"] == [(4.0, JobState.QUEUED), (4.0, JobState.RUNNING)]
    assert "nobody" not in by_job
    records = {r.job_id: r for r in result.jobs}
    assert records["a"].failed == "rank 0 raised RuntimeError: boom"
    assert records["b"].cancelled and records["c"].cancelled and not records["d"].cancelled
    assert result.end_time == 9.0


def test_growing_capacity_starts_a_job_larger_than_the_cluster_instead_of_dropping_it():
    alive = {"gpus": 1}
    feed = ScriptedFeed({0.0: Arrivals(jobs=(make_job("big", min_gpus=2, max_gpus=2, min_batch=32, max_batch=32),)), 5.0: Arrivals(stop=True)})
    clock = FakeClock()

    def capacity():
        if clock.t >= 2.0:
            alive["gpus"] = 2  # a worker joined
        return alive["gpus"]

    executor = ScriptedExecutor()
    result = run_loop(feed, make_policy("elastic_dp"), capacity, clock, executor, LoopSettings(interval_s=100.0))
    assert executor.starts == [(2.0, "big", 2)]
    assert not result.record("big").dropped
    assert result.capacity == 2


def test_a_lost_worker_is_seen_through_the_executor_before_the_next_decision():
    clock = FakeClock()
    alive = {"gpus": 2}

    class ShrinkingExecutor(ScriptedExecutor):
        def in_effect(self, allocation):
            # The cluster really runs "a" on one GPU once its second worker is gone.
            if clock.t < 2.0:
                return allocation
            return Allocation(tuple((j, Share(1, s.global_batch)) for j, s in allocation.shares))

    def capacity():
        if clock.t >= 2.0:
            alive["gpus"] = 1
        return alive["gpus"]

    feed = ScriptedFeed({0.0: Arrivals(jobs=(make_job("a", min_gpus=1, max_gpus=2, min_batch=16, max_batch=512),)), 4.0: Arrivals(stop=True)})
    seen = []
    run_loop(feed, make_policy("elastic_dp"), capacity, clock, ShrinkingExecutor(), LoopSettings(interval_s=100.0), observer=seen.append)
    # At 2 s the observer first hears the forced shrink (an event of its own: the service records
    # it), then the decision sees "a" on one GPU of a one-GPU cluster (not two of one: an invalid snapshot).
    assert [r.time for r in seen] == [0.0, 2.0, 2.0]
    assert [(e.job_id, e.before.gpus, e.after.gpus, e.kind) for e in seen[1].events] == [("a", 2, 1, RescaleKind.IN_PLACE)]
    assert seen[0].allocation.get("a").gpus == 2 and seen[2].allocation.get("a").gpus == 1


def test_a_rank_lost_while_its_worker_stays_alive_is_heard_as_a_shrink_a_waiting_grow_is_not():
    """Capacity never changes here (the lost rank's worker still counts as alive, as a cut link
    does until the scheduler's heartbeat timeout): the shrink is heard from the executor alone.
    Job "b" runs on fewer GPUs than planned too, but because its grow waits for workers: no event."""
    clock = FakeClock()

    class LosingExecutor(ScriptedExecutor):
        regrown: list = []

        def apply(self, now, previous, new, jobs):
            for job_id, before, after in share_changes(previous, new):
                if before is not None and after is not None:
                    self.regrown.append((now, job_id, before.gpus, after.gpus))  # the policy gives "a" its GPU back
            return super().apply(now, previous, new, jobs)

        def in_effect(self, allocation):
            lost = clock.t >= 3.0 and not self.regrown  # a loses a rank at 3 s; b never got its second GPU
            real = {"a": 1 if lost else 2, "b": 1}
            return Allocation(tuple((j, Share(min(real[j], s.gpus), s.global_batch)) for j, s in allocation.shares))

        def waiting_starts(self, now):
            return ("b",)

    feed = ScriptedFeed(
        {
            0.0: Arrivals(jobs=(make_job("a", min_gpus=2, max_gpus=2, min_batch=32, max_batch=32), make_job("b", min_gpus=2, max_gpus=2, min_batch=32, max_batch=32))),
            6.0: Arrivals(stop=True),
        }
    )
    seen = []
    run_loop(feed, make_policy("elastic_dp"), lambda: 4, clock, LosingExecutor(), LoopSettings(interval_s=100.0), observer=seen.append)
    heard = [(r.time, e.job_id, e.before.gpus, e.after.gpus, e.kind) for r in seen for e in r.events if e.before is not None and e.after is not None]
    assert heard == [(3.0, "a", 2, 1, RescaleKind.IN_PLACE)]  # once, when it happened; nothing for b
    # The shrink made the loop decide again at once: the free GPU goes back to "a".
    assert LosingExecutor.regrown == [(3.0, "a", 1, 2)]
