"""Issue 35.2: the code that was submitted runs, on workers that outlive many jobs.

A real `malleable serve` (sqlite store, MLflow, a Dask cluster of two workers, gloo training):
submit ``m:recipe``, edit ``m.py``, submit again. Each rank of each job writes the version its
recipe carries and its process id; the second job's ranks, on the same worker processes as
the first's, write the edited version, and the store and each job's MLflow run record the
SHA-256 of the file as it was when the job started (computed here from the bytes written).
The edit keeps the file's size and lands within the same second: a stale ``.pyc`` would pass
Python's own check, and must not be what runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from service.store import JobStore
from service.store.records import JobState
from tests.service_process import PROFILE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

MODULE = """
import os

from elastic_tasks.examples import mlp_tiny

VERSION = {version!r}


def recipe():
    with open({marks!r}, "a") as f:
        f.write(f"{{VERSION}} {{os.getpid()}}\\n")
    if VERSION == "v3":
        raise RuntimeError("v3 refuses to build")
    return mlp_tiny()
"""


def test_an_edit_between_two_submissions_runs_and_is_recorded(tmp_path):
    marks = tmp_path / "marks.txt"
    work = tmp_path / "work"
    work.mkdir()
    module = work / "m.py"
    (work / "jobs.yaml").write_text(
        yaml.safe_dump({"jobs": [{"id": "j", "workload": "m:recipe", "profile": PROFILE, "samples": 2000, "min_batch": 32, "max_batch": 64, "max_gpus": 2}]})
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLEABLE_", "MLFLOW_"))}
    store_url = f"sqlite:///{work / 'jobs.db'}"
    env.update(
        PYTHONPATH=str(REPO), MALLEABLE_JOB_STORE=store_url, MALLEABLE_STATE_DIR=str(work / "state"), MALLEABLE_WORKERS="2",
        MALLEABLE_INTERVAL_S="2", MALLEABLE_SERVICE_POLL_S="0.2", COLUMNS="250",
    )  # fmt: skip

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flows.commands.cli", *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)

    def run_version(version: str, rc: int = 0) -> tuple[str, str]:
        text = MODULE.format(version=version, marks=str(marks))
        module.write_text(text)
        submitted = cli("submit", "--file", "jobs.yaml")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job_id = submitted.stdout.split("\t")[0].strip()
        waited = cli("wait", job_id, "--timeout", "240")
        assert waited.returncode == rc, waited.stdout + waited.stderr + "\n".join(lines)
        return job_id, "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    serve = subprocess.Popen(
        [sys.executable, "-m", "flows.commands.cli", "serve"], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in serve.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 180
        while not any("serving" in line for line in lines):
            assert serve.poll() is None and time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.2)
        first, first_version = run_version("v1")
        second, second_version = run_version("v2")  # same size as v1
        third, _ = run_version("v3", rc=1)
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=90)
    finally:
        if serve.poll() is None:
            for child in psutil.Process(serve.pid).children(recursive=True):
                child.kill()
            serve.kill()

    # Issue 35.8: the service's log lines are dated (it runs for days; its log is read beside others).
    serving = next(line for line in lines if "serving" in line)
    assert re.match(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} ", serving), serving
    marked = [line.split() for line in marks.read_text().splitlines()]
    v1 = {pid for version, pid in marked if version == "v1"}
    v2 = {pid for version, pid in marked if version == "v2"}
    marked = [m for m in marked if m[0] != "v3"]
    assert v1 and v2, marked
    assert v1 & v2, f"the second job ran in other processes; the test proves nothing about cached modules: {marked}"
    assert [version for version, _ in marked] == sorted(version for version, _ in marked), marked  # every v1 before any v2

    store = JobStore(store_url)
    assert [(r.state, r.code_version) for r in (store.job(first), store.job(second))] == [(JobState.FINISHED, first_version), (JobState.FINISHED, second_version)]
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(f"sqlite:///{work / 'state' / 'mlflow.db'}")
    tags = [mlflow.get_run(store.job(j).mlflow_run_id).data.tags.get("malleable.code_version") for j in (first, second)]
    assert tags == [first_version, second_version]

    # Issue 35.5: a service job's run carries its schedule (the store's generations, as CSV) and
    # a failed job's run its error.
    import csv
    import io

    run_id = store.job(second).mlflow_run_id
    schedule = list(csv.DictReader(io.StringIO(Path(mlflow.download_artifacts(run_id, "schedule.csv", str(tmp_path))).read_text())))
    assert [(int(r["gpus"]), int(r["batch"]), r["kind"]) for r in schedule] == [(a.gpus, a.batch, a.kind) for a in store.allocations(second)]
    failed = store.job(third)
    assert failed.state is JobState.FAILED and "v3 refuses to build" in failed.error
    run = mlflow.get_run(failed.mlflow_run_id)
    assert run.info.status == "FAILED" and "v3 refuses to build" in run.data.tags["malleable.error"]
