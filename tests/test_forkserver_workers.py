"""Training workers fork from one server that imported torch once (deploy/forkserver.py), and
each still starts with the environment of its moment, as a spawned one would.

Run in a fresh interpreter: the server is per process, and the point is a variable that was in
the environment when the server started and is gone by the second cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, os, sys
from distributed import Client
from deploy.local import local_gpu_cluster

def seen():
    import os, sys, psutil
    parent = psutil.Process(os.getppid())
    return {
        "stale": os.environ.get("MALLEABLE_TEST_STALE"), "fresh": os.environ.get("MALLEABLE_TEST_FRESH"),
        "store": os.environ.get("MALLEABLE_JOB_STORE"), "nanny": os.environ.get("MALLEABLE_TEST_NANNY"),
        "torch_preloaded": "torch" in sys.modules, "parent": " ".join(parent.cmdline()), "pid": os.getpid(),
        "group": os.getpgid(0),
    }

if __name__ == "__main__":
    out = []
    os.environ["MALLEABLE_TEST_STALE"] = "from-the-first-cluster"
    with local_gpu_cluster(1) as cluster, Client(cluster) as client:
        out.append(next(iter(client.run(seen).values())))
    del os.environ["MALLEABLE_TEST_STALE"]
    os.environ["MALLEABLE_TEST_FRESH"] = "set-after-the-server-started"
    os.environ["MALLEABLE_JOB_STORE"] = "postgresql://svc:pw@db/jobs"  # a secret: no worker may see it
    with local_gpu_cluster(1, env={"MALLEABLE_TEST_NANNY": "the-nanny's"}) as cluster, Client(cluster) as client:
        out.append(next(iter(client.run(seen).values())))
        client.restart()  # the nanny starts its worker again: same rules
        out.append(next(iter(client.run(seen).values())))
    print(json.dumps([*out, os.getpgid(0)]))
"""


def test_workers_fork_from_a_preloaded_server_with_the_environment_of_their_start(tmp_path: Path) -> None:
    (tmp_path / "fs_probe.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    env.pop("MALLEABLE_JOB_STORE", None)
    proc = subprocess.run([sys.executable, str(tmp_path / "fs_probe.py")], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    *workers, os_group = json.loads(proc.stdout.strip().splitlines()[-1])
    first, second, restarted = workers
    for worker in (first, second, restarted):
        # Forked by multiprocessing's fork server, which had imported torch before the fork.
        assert "forkserver" in worker["parent"] and worker["torch_preloaded"], worker
        # In the caller's process group, as a spawned worker was: a supervisor's killpg reaches it.
        assert worker["group"] == os_group, worker
    assert first["stale"] == "from-the-first-cluster" and first["fresh"] is None
    for worker in (second, restarted):
        # The server started while STALE was set; the worker still has exactly this moment's environment.
        assert worker["stale"] is None and worker["fresh"] == "set-after-the-server-started", worker
        assert worker["store"] is None and worker["nanny"] == "the-nanny's", worker
    assert restarted["pid"] != second["pid"]
