"""docs/deploy.md, walked literally: a real ``prefect server``, the work pool, ``prefect deploy --all``,
a process worker, ``prefect deployment run`` of ``cluster-run`` → COMPLETED with its artifacts, and
the listing commands answer (Prefect 3.8.8 + fastapi 0.153 answered them with 422).

The deployment is made with ``MALLEABLE_HOME`` pointing nowhere, and the worker sets it to the
checkout: the run only completes if the pull step's working directory is resolved on the worker.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.ports import unclaimed_port
from tests.processes import stop
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

TINY_JOBS = """
gpus: 2
policy: elastic_dp
profiles:
  mlp_tiny:
    workload: mlp_tiny
    num_params: 6532
    batch_sizes: [8, 16, 32, 64]
    iter_times_s: [0.0005, 0.0005, 0.0006, 0.0009]
    max_batch_per_gpu: 64
    allreduce: {latency_s: 0.001, seconds_per_param: 2.0e-7}
jobs:
  - {id: tiny, profile: mlp_tiny, samples: 2048, min_batch: 32, max_batch: 128, max_gpus: 2, arrival_s: 0}
"""


def _prefect(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run([str(BIN / "prefect"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"prefect {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _prefect_side_by_side(env: dict[str, str], *commands: tuple[str, ...], timeout: float = 120) -> list[str]:
    """The stdout of independent read-only ``prefect`` commands, run at once: each process spends
    seconds importing prefect, which they need not do one after another."""
    started = [subprocess.Popen([str(BIN / "prefect"), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for args in commands]
    outs = []
    for args, process in zip(commands, started):
        out, err = process.communicate(timeout=timeout)
        assert process.returncode == 0, f"prefect {' '.join(args)} -> {process.returncode}\n{out}\n{err}"
        outs.append(out)
    return outs


def _wait_healthy(url: str, server: subprocess.Popen, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "prefect server exited"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"prefect server not healthy after {limit_s} s")


def _stop(process: subprocess.Popen) -> None:
    stop(process)


@pytest.mark.slow
def test_deploy_md_walk_through(tmp_path, migrated_prefect_home):
    port = unclaimed_port()  # free until the server started later takes it
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MALLEABLE_"))}
    env.update(
        PREFECT_HOME=str(migrated_prefect_home(tmp_path / "prefect-home")),  # its server need not migrate a fresh database
        PREFECT_API_URL=api,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        COLUMNS="250",  # the listing tables, unabridged
        PREFECT_SERVER_API_PORT=str(port),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        # Where the deployment is made, MALLEABLE_HOME means nothing: it must not be baked in.
        MALLEABLE_HOME=str(tmp_path / "not-the-checkout"),
    )
    server = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path, env=env, stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    worker = None
    try:
        _wait_healthy(api, server)
        _prefect(env, "work-pool", "create", "malleable-process", "--type", "process")
        state = tmp_path / "worker-state"
        # The worker waits on the pool from here on: its start-up (importing prefect) overlaps the
        # deploy; it asks for scheduled runs every 2 s (default 10 s), so the run starts soon after it is made.
        worker_env = dict(
            env, MALLEABLE_HOME=str(ROOT), MALLEABLE_STATE_DIR=str(state), MALLEABLE_WORKERS="2", MALLEABLE_EXPERIMENT="deploy-walk", PREFECT_WORKER_QUERY_SECONDS="2"
        )  # fmt: skip
        worker = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", "malleable-process", "--type", "process", "--limit", "1"],
            cwd=tmp_path, env=worker_env, stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        deployed = _prefect(env, "deploy", "--all", timeout=180)
        for name in ("nightly-retrain", "cluster-run", "seed000-reproduction"):
            assert name in deployed.stdout, deployed.stdout

        inspected = _prefect(env, "deployment", "inspect", "cluster/cluster-run").stdout
        assert "deploy.prefect_steps.enter_malleable_home" in inspected, inspected
        assert "not-the-checkout" not in inspected, inspected

        jobs = tmp_path / "jobs.yaml"
        jobs.write_text(TINY_JOBS)
        run = subprocess.run(
            [str(BIN / "prefect"), "deployment", "run", "cluster/cluster-run",
             "--param", f"jobs_file={jobs}", "--param", "interval_s=2", "--watch", "--watch-timeout", "300"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=360,
        )  # fmt: skip
        log = (tmp_path / "worker.log").read_text()
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n--- worker log ---\n{log[-6000:]}"
        assert "COMPLETED" in run.stdout.upper(), run.stdout

        # The run recorded where the worker's settings say, not under the checkout.
        assert (state / "mlflow.db").is_file()

        run_id = re.search(r"UUID: ([0-9a-f-]{36})", run.stdout).group(1)
        # The listing commands are independent reads: asked side by side.
        flow_runs, logs, artifacts, deployments, pools = _prefect_side_by_side(
            env, ("flow-run", "ls"), ("flow-run", "logs", run_id), ("artifact", "ls"), ("deployment", "ls"), ("work-pool", "ls")
        )
        assert "COMPLETED" in flow_runs.upper(), flow_runs
        assert "tiny:" in logs, logs  # the loop's rescale lines, printed by the flow
        for key in ("cluster-schedule", "cluster-results", "cluster-summary"):
            assert key in artifacts, artifacts
        assert "cluster-run" in deployments
        assert "malleable-process" in pools
    finally:
        if worker is not None:
            _stop(worker)
        _stop(server)


def test_the_pull_step_reads_malleable_home_when_it_runs(tmp_path, monkeypatch):
    from deploy.prefect_steps import enter_malleable_home

    config = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert config["pull"] == [{"deploy.prefect_steps.enter_malleable_home": {}}]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MALLEABLE_HOME", str(ROOT))
    assert enter_malleable_home() == {"directory": str(ROOT)} and Path.cwd() == ROOT
    monkeypatch.setenv("MALLEABLE_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="MALLEABLE_HOME="):
        enter_malleable_home()


def test_the_worker_manifest_sets_where_flows_run_and_record():
    manifest = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "prefect-worker.yaml").read_text()))
    (deployment,) = [m for m in manifest if m["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # Its own env, the shared settings ConfigMap it reads, and the image's ENV (MALLEABLE_HOME).
    names = {e["name"] for e in container["env"]}
    settings = yaml.safe_load((ROOT / "deploy" / "k8s" / "settings.yaml").read_text())
    assert {"configMapRef": {"name": settings["metadata"]["name"]}} in container["envFrom"]
    names |= set(settings["data"])
    names |= set(re.findall(r"\b(MALLEABLE_[A-Z_]+)=", (ROOT / "deploy" / "Dockerfile").read_text()))
    assert {"MALLEABLE_HOME", "MALLEABLE_STATE_DIR", "MALLEABLE_TRACKING_URI"} <= names
