"""Seed 000's admission rule: admit while every job still gets a GPU; drop or queue the rest."""

from allocator.admission import OverflowMode, admit, reallocate
from allocator.policies import make_policy
from allocator.types import ClusterSnapshot, RunningJob, Share
from tests.factories import make_job


def _snap(capacity, running=(), queued=()):
    return ClusterSnapshot(0.0, capacity, running=tuple(RunningJob(j, Share(1, j.min_batch)) for j in running), queued=tuple(queued))


def test_admits_while_everyone_fits_and_drops_or_queues_the_rest():
    running = [make_job("r1"), make_job("r2")]
    queued = [make_job(f"q{i}", arrival_time=float(i)) for i in range(4)]
    dp = make_policy("elastic_dp")
    drop = admit(_snap(4, running, queued), dp, OverflowMode.DROP)
    assert [j.id for j in drop.admitted] == ["q0", "q1"] and [j.id for j in drop.dropped] == ["q2", "q3"] and not drop.queued
    queue = admit(_snap(4, running, queued), dp, OverflowMode.QUEUE)
    assert [j.id for j in queue.queued] == ["q2", "q3"] and not queue.dropped


def test_strict_fifo_blocks_behind_a_big_job_backfill_does_not():
    big = make_job("big", min_batch=512, max_batch=512, max_gpus=8, arrival_time=0.0)  # needs 2 GPUs (cap 256)
    small = make_job("small", arrival_time=1.0)
    dp = make_policy("elastic_dp")
    snap = _snap(2, [make_job("r")], [big, small])
    assert [j.id for j in admit(snap, dp, OverflowMode.QUEUE, strict_fifo=True).admitted] == []
    assert [j.id for j in admit(snap, dp, OverflowMode.QUEUE, strict_fifo=False).admitted] == ["small"]


def test_reallocate_gives_running_and_admitted_jobs_shares():
    dp = make_policy("elastic_dp")
    decision = reallocate(_snap(8, [make_job("r")], [make_job("q")]), dp, OverflowMode.QUEUE)
    assert set(decision.allocation) == {"r", "q"} and decision.allocation.total_gpus <= 8


def test_trial_solve_path_for_policies_without_min_gpus():
    class NoShortcut:
        name = "no_shortcut"

        def allocate(self, snapshot):
            return make_policy("elastic_dp").allocate(snapshot)

    queued = [make_job(f"q{i}") for i in range(3)]
    decision = admit(_snap(2, [], queued), NoShortcut(), OverflowMode.DROP)
    assert [j.id for j in decision.admitted] == ["q0", "q1"] and [j.id for j in decision.dropped] == ["q2"]
