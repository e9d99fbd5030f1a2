"""The CLI's local cluster on CPU: every nanny in one ``dask spec`` process, workers forked from one server.

What the layout must keep from the one it replaced (one ``dask spec`` process per worker):
no secret of the caller in any process of the cluster, the cluster's processes in process
groups other than the caller's (a Ctrl-C reaches the caller only), a killed worker restarted
by its nanny with its ``GPU`` resource, and nothing left running after the close.
"""

import os
import signal
import time

import psutil
import pytest
from distributed import Client

from deploy.local import local_cluster
from deploy.nanny_group import group_spec

SECRET = "postgresql://malleable:s3cret-pw@db.invalid/jobs"


def _pid() -> int:
    return os.getpid()


def _sees_secret() -> bool:
    return any("s3cret-pw" in v for v in os.environ.values())


def _cmdline(pid: int) -> str:
    return " ".join(psutil.Process(pid).cmdline())


def _workers(client: Client) -> dict[str, int]:
    """Worker name -> pid, of the workers that answer (a killed one may still be registered)."""
    pids = client.run(_pid, on_error="ignore")
    names = {addr: info["name"] for addr, info in client.scheduler_info(n_workers=-1)["workers"].items()}
    return {names[addr]: pid for addr, pid in pids.items() if addr in names}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_one_process_holds_every_nanny_its_workers_fork_keep_no_secret_and_come_back_when_killed(monkeypatch):
    monkeypatch.setenv("MALLEABLE_JOB_STORE", SECRET)
    me = psutil.Process()
    with local_cluster(3, visible=[]) as cluster, Client(cluster) as client:
        client.wait_for_workers(3, timeout=120)
        workers = _workers(client)
        assert sorted(workers) == ["gpu-0", "gpu-1", "gpu-2"]
        parents = {psutil.Process(pid).ppid() for pid in workers.values()}
        assert len(parents) == 1, parents  # one server forked them all
        [server] = parents
        assert "multiprocessing.forkserver" in _cmdline(server)
        nannies = psutil.Process(server).ppid()
        assert "distributed.cli.dask_spec" in _cmdline(nannies) and _cmdline(nannies).count("TrainingNanny") == 3
        specs = [p for p in me.children() if "distributed.cli.dask_spec" in " ".join(p.cmdline())]
        assert len(specs) == 2, [p.cmdline() for p in specs]  # the scheduler's and the nannies'
        # Apart from the caller: other process groups, and no secret anywhere in the cluster.
        assert {os.getpgid(p.pid) for p in specs}.isdisjoint({os.getpgid(0)})
        assert {os.getpgid(pid) for pid in workers.values()} == {os.getpgid(nannies)}
        assert not any(client.run(_sees_secret).values())
        for proc in [*specs, psutil.Process(server)]:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                assert b"s3cret-pw" not in f.read()
        # A killed worker is forked again by its nanny, from the same server, with its GPU.
        os.kill(workers["gpu-1"], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while (again := _workers(client)).get("gpu-1") in (None, workers["gpu-1"]) or len(again) < 3:
            assert time.monotonic() < deadline, again
            time.sleep(0.2)
        assert psutil.Process(again["gpu-1"]).ppid() == server
        resources = {info["name"]: info["resources"] for info in client.scheduler_info(n_workers=-1)["workers"].values()}
        assert resources == {name: {"GPU": 1} for name in ("gpu-0", "gpu-1", "gpu-2")}
        every = [p.pid for p in specs] + [server, *again.values()]
    deadline = time.monotonic() + 30
    while (alive := [pid for pid in every if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]):
        assert time.monotonic() < deadline, f"still running after the close: {alive}"
        time.sleep(0.2)


def test_a_group_of_no_workers_is_refused_by_name():
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match=f"workers={bad!r}"):
            group_spec("gpu", bad, {})
