"""A finished job leaves nothing on a long-lived Dask scheduler (real scheduler, its own stores)."""

from __future__ import annotations

from elastic_tasks.board import EventKind, JobBoard, JobStatus, RankEvent


def _held(needle: str, dask_scheduler=None) -> list[str]:  # noqa: ANN001  (runs on the scheduler)
    ext = dask_scheduler.extensions
    names = [*dask_scheduler.task_metadata, *ext["variables"].variables, *ext["events"]._events, *ext["queues"].queues]
    return sorted(n for n in names if isinstance(n, str) and needle in n)


def test_forget_removes_one_jobs_state_and_only_that():
    from distributed import Client, Event, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        boards = {job: JobBoard(job, client) for job in ("job-a", "job-b")}
        for board in boards.values():
            board.mark_started("rank-0")
            board.set_rendezvous(0, "127.0.0.1", 29500)
            board.set_status(JobStatus(version=0, step=3, samples_seen=96, world_size=1, global_batch=32, loss=0.5, time=1.0))
            board.post(RankEvent(EventKind.FINISHED, "rank-0", 0, 3))
            Event(f"malleable-{board.job_id}-published-0", client=client).set()  # what publish() raises for its ranks
            assert board.wait_published(0, timeout=5) is True

        before = client.run_on_scheduler(_held, "malleable-job-a-")
        assert len(before) >= 5, before  # flag, rendezvous, status, event queue, published event
        kept = client.run_on_scheduler(_held, "malleable-job-b-")

        assert boards["job-a"].forget() == len(before)
        assert client.run_on_scheduler(_held, "malleable-job-a-") == []
        assert client.run_on_scheduler(_held, "malleable-job-b-") == kept
