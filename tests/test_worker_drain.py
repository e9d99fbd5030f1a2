"""A worker given back goes free only once the rank task that held it has ended (real Dask; slow).

Dask cannot stop a running task: cancelling a dropped rank's future leaves its function running
in the worker's only thread, and a rank placed there next would queue behind it and never start
(a job's start then hangs). The pool hands such a worker out once its task has ended, and a
worker whose task outlives the pool's grace is restarted by its nanny and handed out after.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from distributed import Client

from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import WorkerPool
from elastic_tasks.devices import GPU_RESOURCE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def client():
    with local_gpu_cluster(1) as cluster, Client(cluster) as c:
        c.wait_for_workers(1, timeout=60)
        yield c


def _ignore_cancellation(folder: str) -> int:
    """A rank-like task that never looks at Dask: it runs until ``release`` appears, then marks its end."""
    here = Path(folder)
    (here / "started").write_text(str(os.getpid()))
    while not (here / "release").exists():
        time.sleep(0.02)
    (here / "ended").touch()
    return os.getpid()


def _pid() -> int:
    return os.getpid()


def _submit(client: Client, worker: str, fn, *args):  # noqa: ANN001, ANN202
    """As the coordinator places a rank: pinned to its worker, holding its GPU."""
    return client.submit(fn, *args, workers=[worker], allow_other_workers=False, resources={GPU_RESOURCE: 1}, pure=False)


def _executing(dask_worker) -> int:  # noqa: ANN001
    return dask_worker.state.executing_count


def _until(predicate, timeout_s: float = 120.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"  # a hang check, not a timing assertion
        time.sleep(0.05)


def _start_zombie(client: Client, pool: WorkerPool, folder: Path) -> tuple[str, int]:
    """Job "a" takes the worker, its rank starts, is dropped (cancelled) and its worker given back."""
    [worker] = pool.take("a", 1)
    rank = _submit(client, worker, _ignore_cancellation, str(folder))
    _until(lambda: (folder / "started").exists())
    rank.cancel()
    pool.give_back([worker], owner="a")
    return worker, int((folder / "started").read_text())


def test_a_worker_is_handed_out_only_after_its_cancelled_rank_ended(client, tmp_path):
    pool = WorkerPool(client, grace_s=3600.0)  # no restart in this test
    worker, _ = _start_zombie(client, pool, tmp_path)
    assert client.run(_executing, workers=[worker]) == {worker: 1}  # the cancelled rank still runs
    assert pool.free() == []

    taken: list[tuple[list[str], bool]] = []
    # Job "b" wants the worker meanwhile: its take waits, and returns only after the rank's end.
    taker = threading.Thread(target=lambda: taken.append((pool.take("b", 1), (tmp_path / "ended").exists())))
    taker.start()
    assert pool.free() == [] and not (tmp_path / "ended").exists()
    (tmp_path / "release").touch()
    taker.join(timeout=120)
    assert taken == [([worker], True)]
    assert pool.busy == {worker: "b"}
    # b's rank starts there (it used to queue behind the cancelled one).
    assert _submit(client, worker, _pid).result(timeout=60) == client.run(_pid, workers=[worker])[worker]


def test_a_worker_whose_cancelled_rank_never_ends_is_restarted_then_handed_out(client, tmp_path):
    pool = WorkerPool(client, grace_s=1.0)
    worker, zombie_pid = _start_zombie(client, pool, tmp_path)  # never released
    assert client.run(_executing, workers=[worker]) == {worker: 1}

    [back] = pool.take("b", 1)  # waits through the grace and the nanny's restart

    pid = client.run(_pid, workers=[back])[back]
    assert pid != zombie_pid  # a fresh process: the zombie's is gone
    assert client.run(_executing, workers=[back]) == {back: 0}
    assert not (tmp_path / "ended").exists()  # the rank never ended: it was killed with its process
    assert pool.busy == {back: "b"}
    _until(lambda: pool.draining == {})  # the restart's own thread forgets the old process as it returns
    assert _submit(client, back, _pid).result(timeout=60) == pid
