"""Issue 28.2-4 beyond the one-line bad inputs: idempotency keys bound to the job, raw
tab-separated output, `cancel` that validates before acting and respects ownership, read-only
commands that create nothing, hostile names shown escaped, the entry-point allow-list at the
service, database roles on PostgreSQL, LISTEN/NOTIFY. Real sqlite files and the local
PostgreSQL server; the CLI through CliRunner or as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.commands.cli import app
from service.client import ServiceClient
from service.feed import StoreFeed
from service.jobs.jobspec import spec_from_entry
from service.store.records import JobState, Submission
from service.runner import ServiceConfig
from service.store import JobStore, StorePermissionError
from tests.service_helpers import drop_postgres, job_entry, postgres_url

REPO = Path(__file__).resolve().parents[1]
MLP = "elastic_tasks.examples:mlp_tiny"
HOSTILE = "\x1b[31mRED\x1b[0m\x1b]0;pwned\x07\nforged row"


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    env = {"MALLEABLE_JOB_STORE": url, "MALLEABLE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}

    def run(*args: str, **extra: str):
        return CliRunner(env={**env, **extra}).invoke(app, list(args))

    return run, url


def test_an_idempotency_key_returns_the_same_job_and_refuses_another(cli):
    run, url = cli
    first = run("submit", MLP, "--samples", "1000", "--key", "K")
    assert first.exit_code == 0, first.output
    job_id = first.output.strip().splitlines()[-1]
    again = run("submit", MLP, "--samples", "1000", "--key", "K")
    assert again.exit_code == 0 and again.output.strip().splitlines()[-1] == f"{job_id}\t(already submitted)"
    other = run("submit", MLP, "--samples", "2000", "--key", "K")
    lines = [line for line in other.output.splitlines() if line.strip()]
    assert other.exit_code == 2 and len(lines) == 1, other.output
    assert "--key='K'" in lines[0] and job_id in lines[0] and "samples" in lines[0]
    assert [r.total_samples for r in JobStore(url).jobs()] == [1000]


def test_ids_are_printed_tab_separated_for_cut(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "MALLEABLE_JOB_STORE": f"sqlite:///{tmp_path / 'jobs.db'}", "COLUMNS": "40"}
    jobs_file = REPO / "examples" / "quickstart" / "jobs.yaml"

    def malleable(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "flows.commands.cli", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        return done.stdout

    out = malleable("submit", "--file", str(jobs_file))
    rows = [line.split("\t") for line in out.splitlines()]
    assert [r[1] for r in rows] == ["job-a", "job-b", "job-c"], out
    ids = [r[0] for r in rows]
    cut = subprocess.run(["cut", "-f1"], input=malleable("cancel", *ids), capture_output=True, text=True).stdout.split()
    assert cut == ids
    assert [line.split("\t")[:2] for line in malleable("wait", *ids).splitlines()] == [[i, "cancelled"] for i in ids]


def test_cancel_checks_every_id_before_cancelling_any(cli):
    run, url = cli
    job_id = ServiceClient(url).submit(job_entry("a")).job_id
    result = run("cancel", job_id, "nope")
    assert result.exit_code == 2 and "JOB_ID='nope'" in result.output
    assert JobStore(url).job(job_id).state is JobState.QUEUED


def test_cancel_of_another_submitters_job_needs_force_and_is_recorded(cli):
    run, url = cli
    job_id = ServiceClient(url, submitter="alice@elsewhere").submit(job_entry("a")).job_id
    refused = run("cancel", job_id)
    assert refused.exit_code == 2 and "--force" in refused.output and "alice@elsewhere" in refused.output
    assert JobStore(url).job(job_id).state is JobState.QUEUED
    forced = run("cancel", job_id, "--force")
    assert forced.exit_code == 0, forced.output
    row = JobStore(url).job(job_id)
    assert row.state is JobState.CANCELLED and "with --force" in row.error


@pytest.mark.parametrize("args", [("jobs",), ("jobs", "--format", "json"), ("cancel", "jx"), ("wait", "jx")])
def test_read_only_commands_create_no_store(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    result = CliRunner(env={"MALLEABLE_JOB_STORE": None, "MALLEABLE_STATE_DIR": None}).invoke(app, list(args))
    assert result.exit_code in (0, 2), result.output
    assert list(tmp_path.iterdir()) == []


def test_a_hostile_name_is_refused_at_submit_and_one_written_by_other_means_shown_escaped(cli):
    run, url = cli
    result = run("submit", MLP, "--samples", "1000", "--name", HOSTILE)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "--name=" in lines[0] and "control characters" in lines[0], result.output
    assert "\x1b" not in result.output
    assert JobStore(url).jobs() == []
    # A store written by other means (no validator on the way): stored as given, shown escaped.
    store = JobStore(url)
    store.submit(Submission(HOSTILE, spec_from_entry(job_entry("h")), "mallory@elsewhere"))
    assert store.jobs()[0].name == HOSTILE
    shown = run("jobs")
    assert shown.exit_code == 0
    assert "\x1b" not in shown.output and "\x07" not in shown.output
    assert "\\x1b[31mRED" in shown.output
    # One header and one job row: the newline in the name forged no row.
    assert len([line for line in shown.output.splitlines() if line.strip()]) == 2, shown.output


def test_the_service_fails_refused_and_unimportable_entry_points_before_admission(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    client = ServiceClient(store)
    ok = client.submit(job_entry("ok")).job_id
    outside = client.submit(job_entry("outside", workload="team_other.models:net")).job_id
    feed = StoreFeed(store, threading.Event(), allowed=("elastic_tasks.*",))
    assert [j.id for j in feed.poll(0.0).jobs] == [ok]
    assert store.job(outside).state is JobState.FAILED and "MALLEABLE_ALLOWED_ENTRYPOINTS" in store.job(outside).error
    missing = client.submit(job_entry("missing", workload="i28_no_such_pkg.mod:fn")).job_id
    assert [j.id for j in StoreFeed(store, threading.Event()).poll(0.0).jobs] == [ok]  # a fresh feed, no allow-list
    assert store.job(missing).state is JobState.FAILED and "i28_no_such_pkg" in store.job(missing).error


@pytest.mark.parametrize("policy", ["idle_nodes_milp", "idle_nodes_fifo"])
def test_the_service_refuses_idle_node_policies(tmp_path, policy):
    with pytest.raises(ValueError, match=f"policy='{policy}'.*node names"):
        ServiceConfig(store_url=f"sqlite:///{tmp_path / 'j.db'}", checkpoint_root=str(tmp_path), policy=policy)


@pytest.fixture
def pg():
    url = postgres_url()
    yield url
    drop_postgres(url)


def test_postgres_records_the_session_role_and_a_read_only_role_gets_one_line(pg, tmp_path):
    import sqlalchemy

    store = JobStore(pg)
    job_id = ServiceClient(store, submitter="free text").submit(job_entry("a")).job_id
    assert store.job(job_id).submitter == "postgres (free text)"
    watcher = f"watcher_{pg.rsplit('_', 1)[1]}"
    admin = sqlalchemy.create_engine(pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {watcher} LOGIN")
        conn.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {watcher}")
    try:
        url = pg.replace("postgres@", f"{watcher}@")
        run = CliRunner(env={"MALLEABLE_JOB_STORE": url, "MALLEABLE_STATE_DIR": str(tmp_path), "COLUMNS": "250"})
        listed = run.invoke(app, ["jobs"])
        assert listed.exit_code == 0 and job_id in listed.output
        for args, operation in ((["submit", MLP, "--samples", "100"], "may not submit jobs"), (["cancel", job_id, "--force"], "may not cancel jobs")):
            result = run.invoke(app, args)
            lines = [line for line in result.output.splitlines() if line.strip()]
            assert result.exit_code == 2 and len(lines) == 1, result.output
            assert f"role '{watcher}'" in lines[0] and operation in lines[0] and "Traceback" not in result.output
        with pytest.raises(StorePermissionError):
            JobStore(url).submit(Submission("x", spec_from_entry(job_entry("x")), "w"))
        assert [r.state for r in store.jobs()] == [JobState.QUEUED]
    finally:
        admin.dispose()
        eng = sqlalchemy.create_engine(pg, isolation_level="AUTOCOMMIT")
        with eng.connect() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {watcher}")
            conn.exec_driver_sql(f"DROP ROLE {watcher}")
        eng.dispose()


def _poll_until(feed, what, t0: float):
    """Polls at loop times t0, t0 + 0.001, ... (all far before the feed's next interval) until
    ``what`` of the arrivals is non-empty: a NOTIFY reaches the listening socket a moment after
    the commit. Hang bound 10 s of real time."""
    import time

    deadline = time.monotonic() + 10
    t = t0
    while time.monotonic() < deadline:
        got = getattr(feed.poll(t), what)
        if got:
            return got
        t += 0.001
        time.sleep(0.01)
    return ()


def test_postgres_notify_wakes_the_feed_before_its_next_poll(pg):
    store = JobStore(pg)
    feed = StoreFeed(store, threading.Event(), poll_s=1000.0)
    try:
        assert feed.listener is not None
        assert feed.poll(0.0).jobs == ()
        job_id = ServiceClient(store).submit(job_entry("a")).job_id
        # Within seconds, 999 s before the next interval's look: the NOTIFY makes it look now.
        assert [j.id for j in _poll_until(feed, "jobs", 1.0)] == [job_id]
        assert feed.poll(2.0).jobs == ()
        ServiceClient(store).cancel(job_id)
        assert _poll_until(feed, "cancelled", 3.0) == (job_id,)
    finally:
        feed.close()
