"""Small things a team meets first: `malleable jobs --watch` into a pipe, and the `cluster-run`
deployment's default jobs file showing what the system is for (in-place rescales)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from allocator.loop import LoopSettings
from allocator.policies import make_policy
from allocator.simulator.run import simulate
from allocator.specs import JobsFile
from allocator.types import RescaleKind
from flows.config.jobfile import load_jobs_file
from service.client import ServiceClient
from tests.service_helpers import job_entry

ROOT = Path(__file__).resolve().parents[1]


def test_jobs_watch_into_a_pipe_prints_a_table_per_interval(tmp_path):
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    ServiceClient(store, submitter="alice").submit(job_entry("queued-one"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(PYTHONPATH=str(ROOT), MALLEABLE_JOB_STORE=store, COLUMNS="120")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.commands.cli", "jobs", "--watch", "--interval", "0.2"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # A hang check: a watch that prints nothing into a pipe is stopped after a generous while.
    stop = threading.Timer(240, proc.send_signal, args=(signal.SIGINT,))
    stop.start()
    tables = 0
    try:
        for line in proc.stdout:
            tables += "queued-one" in line
            if tables >= 3:
                break
    finally:
        stop.cancel()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert tables >= 3, err
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_the_cluster_run_deployments_default_jobs_rescale_in_place():
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (deployment,) = [d for d in project["deployments"] if d["name"] == "cluster-run"]
    spec: JobsFile = load_jobs_file(ROOT / deployment["parameters"]["jobs_file"])
    result = simulate(spec.jobs, make_policy(spec.policy or "elastic_dp"), spec.gpus or 4, LoopSettings(interval_s=deployment["parameters"]["interval_s"]))
    in_place = [e for e in result.events if e.kind is RescaleKind.IN_PLACE]
    # Every job overlaps another: each arrival shrinks a running job, each completion grows one.
    assert len(in_place) >= 3 and {e.job_id for e in in_place} == {j.id for j in spec.jobs}
    assert all(r.finish is not None for r in result.jobs)
