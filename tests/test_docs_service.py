"""docs/service.md's Python client example, run as written against a live `malleable serve`, and the
profile the client plans with when a job names none (one cache with `malleable profile`)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from allocator.profiles.io import profile_from_dict
from service.client import ServiceClient
from service.jobs.priors import cached_profile

ROOT = Path(__file__).resolve().parents[1]
ENTRY = {"id": "exp-7", "workload": "elastic_tasks.examples:mlp_tiny", "samples": 8_192, "min_batch": 32, "max_batch": 256, "max_gpus": 2}


def python_example() -> str:
    text = (ROOT / "docs" / "service.md").read_text()
    section = text.split("From Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_a_job_without_a_profile_plans_with_a_neutral_prior_and_says_so(tmp_path, caplog):
    client = ServiceClient(f"sqlite:///{tmp_path / 'jobs.db'}", submitter="alice")
    with caplog.at_level(logging.WARNING, logger="service.client"):
        job = client.submit(dict(ENTRY))
    stored = profile_from_dict(client.job(job.job_id).spec["profile"])
    assert stored.hardware == "prior" and stored.workload == "mlp_tiny"
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "neutral prior" in notes[0] and "malleable profile elastic_tasks.examples:mlp_tiny" in notes[0]


def test_a_bad_entry_is_the_clis_one_line_error_and_stores_nothing(tmp_path):
    client = ServiceClient(f"sqlite:///{tmp_path / 'jobs.db'}", submitter="alice")
    with pytest.raises(ValueError) as err:
        client.submit({**ENTRY, "max_gpus": 0})
    assert str(err.value) == "job 'exp-7'.max_gpus=0: must be a positive integer (jobs[0])"
    assert client.jobs() == []


def test_malleable_profile_and_the_client_share_one_profile_cache(tmp_path, monkeypatch):
    """What `malleable profile` measured (into <state dir>/profiles, by default) is what a job
    submitted from Python without a profile plans with."""
    from flows.commands.cli import app

    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    fast = ["--batches", "4,8", "--repeats", "1", "--warmup", "0", "--gpus-for-allreduce", "1", "--threads", "1"]
    result = CliRunner().invoke(app, ["profile", "elastic_tasks.examples:mlp_tiny", *fast, "--out", str(tmp_path / "measured.json")])
    assert result.exit_code == 0, result.output
    measured = profile_from_dict(json.loads((tmp_path / "measured.json").read_text()))
    cache = tmp_path / "state" / "profiles"
    assert cached_profile(cache, "elastic_tasks.examples:mlp_tiny") == measured
    client = ServiceClient(f"sqlite:///{tmp_path / 'jobs.db'}", submitter="alice", profile_cache_dir=cache)
    job = client.submit(dict(ENTRY))
    assert profile_from_dict(client.job(job.job_id).spec["profile"]) == measured


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_python_example_of_docs_service_md_runs_as_written(tmp_path):
    from tests.service_process import ServiceProcess

    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLEABLE_", "PREFECT_"))}
    env.update(PYTHONPATH=str(ROOT), MALLEABLE_JOB_STORE=store, MALLEABLE_WORKERS="2", MALLEABLE_STATE_DIR=str(tmp_path / ".malleable"))
    service = ServiceProcess(tmp_path, env)
    try:
        service.wait_for_line("serving", timeout=600)  # a hang check on a loaded machine
        done = subprocess.run([sys.executable, "-c", python_example()], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    finally:
        service.kill_tree()
    assert done.returncode == 0, done.stdout + done.stderr + "\n--- service ---\n" + service.output()[-3000:]
    assert re.match(r"exp-7 finished \d+ steps, final loss \d+\.\d{3}$", done.stdout.strip()), done.stdout
    assert "Traceback" not in done.stderr and "neutral prior" in done.stderr  # nothing cached in this fresh state directory
