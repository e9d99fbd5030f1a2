"""Teams in the service, without a cluster: the feed puts each job in its submitter's team (from the
service's teams file, whatever the submission says), and `malleable jobs --usage` reports used vs
entitled GPU-hours per team and submitter from the store (figures worked out by hand here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from allocator.fairness.teams import Team, TeamTable
from service.client import ServiceClient
from service.feed import StoreFeed
from service.store import JobStore
from service.store.records import AllocationRow, JobState
from tests.service_helpers import job_entry

REPO = Path(__file__).resolve().parents[1]
TEAMS_YAML = "default_team: others\nteams:\n  research: {quota: 3, members: [alice]}\n  product: {quota: 1, members: ['bob*']}\n"


def test_the_feed_places_each_job_in_its_submitters_team_and_ignores_a_team_the_submission_names(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    table = TeamTable((Team("research", quota=3, members=("alice",)), Team("product", quota=1, members=("bob*",))), default="others")
    ServiceClient(store, submitter="alice@laptop").submit(job_entry("a", team="product"))
    ServiceClient(store, submitter="bob@ci").submit(job_entry("b"))
    ServiceClient(store, submitter="carol@laptop").submit(job_entry("c", priority="nightly"))
    feed = StoreFeed(store, threading.Event(), teams=table, listen=False)
    jobs = {store.job(j.id).name: j for j in feed.poll(0.0).jobs}
    assert {n: (j.team, j.submitter) for n, j in jobs.items()} == {
        "a": ("research", "alice@laptop"), "b": ("product", "bob@ci"), "c": ("others", "carol@laptop"),
    }  # fmt: skip
    assert jobs["c"].priority == 100
    assert feed.team_of == {j.id: j.team for j in jobs.values()}


def test_jobs_usage_reports_used_and_entitled_gpu_hours_per_team_and_submitter(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    t0 = time.time() - 4 * 3600
    # alice (research, quota 3): a job of up to 4 GPUs for 3 h: 4 GPUs for 2 h, then 3 for 1 h.
    # bob (product, quota 1): a job of up to 2 GPUs from 2 h to 3 h on 1 GPU, finished.
    a = ServiceClient(store, submitter="alice@laptop").submit(job_entry("a", samples=10_000, max_gpus=4)).job_id
    b = ServiceClient(store, submitter="bob@ci").submit(job_entry("b", samples=10_000, max_gpus=2)).job_id
    store.update_job(a, submitted_at=t0)
    store.update_job(b, submitted_at=t0 + 2 * 3600)
    store.record_allocations([AllocationRow(a, t0, 4, 64, "start")])
    store.record_allocations([AllocationRow(a, t0 + 2 * 3600, 3, 64, "in_place"), AllocationRow(b, t0 + 2 * 3600, 1, 64, "start")])
    store.set_state(a, JobState.FINISHED, finished_at=t0 + 3 * 3600)
    store.set_state(b, JobState.FINISHED, finished_at=t0 + 3 * 3600)
    (tmp_path / "teams.yaml").write_text(TEAMS_YAML)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(PYTHONPATH=str(REPO), MALLEABLE_STATE_DIR=str(tmp_path / "state"), MALLEABLE_JOB_STORE=f"sqlite:///{tmp_path / 'jobs.db'}", MALLEABLE_TEAMS="teams.yaml")
    run = subprocess.run([sys.executable, "-m", "flows.commands.cli", "jobs", "--usage", "--format", "json", "--gpus", "4"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads(run.stdout)
    research, product = out["teams"]["research"], out["teams"]["product"]
    assert (research["nominal_gpus"], product["nominal_gpus"]) == (3, 1)
    assert research["used_gpu_h"] == pytest.approx(4 * 2 + 3 * 1, abs=1e-3)
    assert research["entitled_gpu_h"] == pytest.approx(3 * 3, abs=1e-3)  # min(3, 4) for 3 h
    assert product["used_gpu_h"] == pytest.approx(1.0, abs=1e-3) and product["entitled_gpu_h"] == pytest.approx(1.0, abs=1e-3)
    assert out["submitters"]["alice@laptop"] == {"team": "research", "used_gpu_h": pytest.approx(11.0, abs=1e-3), "entitled_gpu_h": pytest.approx(9.0, abs=1e-3)}
    assert research["finished"] == 1 and research["max_rho"] is not None  # ρ against the team's modelled run alone on its 3 GPUs

    # A teams file that is not there: one line naming it, exit 2, no traceback.
    env["MALLEABLE_TEAMS"] = "nope.yaml"
    bad = subprocess.run([sys.executable, "-m", "flows.commands.cli", "jobs", "--usage"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "teams file 'nope.yaml': no such file" in bad.stderr and "Traceback" not in bad.stderr + bad.stdout


def test_submit_asks_for_a_priority_class_and_a_wrong_one_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    # The store a service would serve, named (submit makes no store of its own: issue 35.4).
    env.update(PYTHONPATH=str(REPO), MALLEABLE_STATE_DIR=str(tmp_path / "state"), MALLEABLE_JOB_STORE=f"sqlite:///{tmp_path / 'state' / 'jobs.db'}")
    base = [sys.executable, "-m", "flows.commands.cli", "submit", "elastic_tasks.examples:mlp_tiny", "--samples", "1000"]
    ok = subprocess.run([*base, "--priority", "nightly"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    store = JobStore(f"sqlite:///{tmp_path / 'state' / 'jobs.db'}")
    assert store.job(ok.stdout.split()[0]).job_spec().priority == 100
    bad = subprocess.run([*base, "--priority", "urgent"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--priority='urgent': unknown priority class" in bad.stderr and "Traceback" not in bad.stderr + bad.stdout
