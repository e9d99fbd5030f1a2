"""A shrink forced by a lost rank is a row in the service's allocation history (issue 33).

The coordinator shrinks a job in place when a rank is lost, without the loop deciding it; the
loop hears it from the executor (``in_effect``) and the service's recorder writes it to the
real store like any change of share, so the history says what the job really ran on."""

from allocator.loop import LoopSettings, run_loop
from allocator.loop.execution import share_changes
from allocator.loop.sources import Arrivals
from allocator.policies import make_policy
from allocator.types import Allocation, RescaleEvent, RescaleKind, Share
from service.client import ServiceClient
from service.recorder import StoreRecorder
from service.store import JobStore
from service.tracking import ServiceTracking
from tests.factories import make_job
from tests.service_helpers import job_entry
from tests.test_loop import FakeClock
from tests.test_loop_live import ScriptedExecutor, ScriptedFeed

LOST_AT, STOP_AT = 3.0, 6.0


class LosesOneRank(ScriptedExecutor):
    """Applies every change (events for grows and shrinks too); the job's real size drops by one
    GPU at ``LOST_AT`` until the loop applies a new share to it."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.real = clock, {}

    def apply(self, now, previous, new, jobs):
        events = super().apply(now, previous, new, jobs)
        for job_id, before, after in share_changes(previous, new):
            if after is not None:
                self.real[job_id] = after.gpus
            if before is not None and after is not None:
                events.append(RescaleEvent(now, job_id, before, after, RescaleKind.IN_PLACE))
        return events

    def in_effect(self, allocation):
        if self.clock.t >= LOST_AT and not getattr(self, "lost", False):
            self.lost = True
            self.real = {j: g - 1 for j, g in self.real.items()}
        return Allocation(tuple((j, Share(min(self.real.get(j, s.gpus), s.gpus), s.global_batch)) for j, s in allocation.shares))


def test_a_lost_ranks_shrink_and_the_regrow_after_it_are_rows_in_the_store(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    job_id = ServiceClient(store, submitter="alice").submit(job_entry("a", 10_000, min_batch=16, max_batch=512, min_gpus=1, max_gpus=2)).job_id
    tracking = ServiceTracking(None, "exp", warn=lambda _line: None)
    recorder = StoreRecorder(store, tracking, lambda j: str(tmp_path / "ckpt" / j), lambda _j: None, say=lambda _line: None)
    clock = FakeClock()
    job = make_job(job_id, min_gpus=1, max_gpus=2, min_batch=16, max_batch=512)
    feed = ScriptedFeed({0.0: Arrivals(jobs=(job,)), STOP_AT: Arrivals(stop=True)})
    try:
        run_loop(feed, make_policy("elastic_dp"), lambda: 2, clock, LosesOneRank(clock), LoopSettings(interval_s=100.0), observer=recorder.observer, on_job=recorder.on_job)
    finally:
        tracking.close()
    rows = [(r.kind, r.gpus) for r in store.allocations(job_id)]
    # Started on both GPUs; the lost rank's shrink to one, when it happened (wall time: the
    # recorder stamps rows with time.time(), so only the kinds and sizes are compared in order);
    # then the loop, deciding again at once, gives the free GPU back.
    assert rows == [("start", 2), ("in_place", 1), ("in_place", 2)]
    assert store.job(job_id).gpus == 2
