"""The job store and its lease on real databases: sqlite files and (when reachable) PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from sqlalchemy import update

from service.store import schema
from service.client import ServiceClient
from service.store.lease import Lease, LeaseHeldError
from service.jobs.jobspec import spec_from_entry
from service.store.records import AllocationRow, JobState, Submission
from service.store import NOTIFY_CHANNEL, IdempotencyConflict, JobStore, StoreError, StoreVersionError, UnknownJobError
from tests.service_helpers import drop_postgres, job_entry, postgres_url


def as_recorded(store_url: str, submitter: str) -> str:
    """PostgreSQL records the session's role first (the fixtures connect as postgres)."""
    return f"postgres ({submitter})" if store_url.startswith("postgresql") else submitter


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    url = postgres_url()
    yield url
    drop_postgres(url)


def test_submissions_keep_their_order_fields_and_idempotency(store_url):
    client = ServiceClient(store_url, submitter="alice@host")
    first = client.submit(job_entry("a", samples=500), idempotency_key="k1")
    again = client.submit(job_entry("a", samples=500), idempotency_key="k1")  # a retried task
    other = client.submit(job_entry("b", samples=700))
    assert first.created and not again.created and again.job_id == first.job_id
    rows = client.jobs()
    assert [r.id for r in rows] == [first.job_id, other.job_id]
    assert [r.name for r in rows] == ["a", "b"] and [r.total_samples for r in rows] == [500, 700]
    assert all(r.state is JobState.QUEUED and r.submitter == as_recorded(store_url, "alice@host") for r in rows)
    assert rows[0].spec["total_samples"] == 500 and rows[0].spec["workload"] == "elastic_tasks.examples:mlp_tiny"


def test_a_bad_submission_names_the_field_and_writes_nothing(store_url):
    client = ServiceClient(store_url)
    with pytest.raises(ValueError, match=r"min_batch=64: is greater than max_batch=16"):
        client.submit(job_entry("bad", min_batch=64, max_batch=16))
    with pytest.raises(ValueError, match=r"workload='not an entry point'"):
        client.submit(job_entry("bad", workload="not an entry point"))
    assert client.jobs() == []


def test_cancel_ends_a_queued_job_at_once_and_flags_a_running_one_for_the_service(store_url):
    store = JobStore(store_url)
    client = ServiceClient(store)
    queued = client.submit(job_entry("q")).job_id
    running = client.submit(job_entry("r")).job_id
    assert store.set_state(running, JobState.RUNNING, only_from=(JobState.QUEUED,))
    assert client.cancel(queued).state is JobState.CANCELLED
    row = client.cancel(running)
    assert row.state is JobState.RUNNING and row.cancel_requested
    # The service hears each request once; a queued job cancelled before it was seen is not started.
    assert sorted(store.take_cancel_requests()) == sorted([queued, running])
    assert store.take_cancel_requests() == []
    assert [r.id for r in store.jobs(states=[JobState.QUEUED])] == []
    with pytest.raises(UnknownJobError):
        client.cancel("j-nope")


def test_a_state_change_from_an_unexpected_state_is_refused(store_url):
    store = JobStore(store_url)
    job = ServiceClient(store).submit(job_entry("x")).job_id
    store.request_cancel(job)
    # The service tries to start a job a client cancelled meanwhile: the store keeps "cancelled".
    assert not store.set_state(job, JobState.RUNNING, only_from=(JobState.QUEUED, JobState.SUSPENDED))
    assert store.job(job).state is JobState.CANCELLED


def test_a_store_of_another_schema_version_is_refused_not_used(store_url):
    store = JobStore(store_url)
    with store.engine.begin() as conn:
        conn.execute(update(schema.meta).where(schema.meta.c.key == "schema_version").values(value="999"))
    with pytest.raises(StoreVersionError, match=rf"schema version 999, this malleable uses {schema.SCHEMA_VERSION}"):
        JobStore(store_url)


def test_a_version_1_store_is_upgraded_in_place_keeping_its_jobs(store_url):
    """A store made before jobs recorded their losses (version 1): opened by this version, it gains
    the columns, keeps every job, and records a finished job's losses."""
    store = JobStore(store_url)
    job = ServiceClient(store, submitter="old").submit(job_entry("kept", samples=321)).job_id
    added = ("steps", "first_loss", "final_loss", "eval_loss", "mlflow_parent_run_id")
    with store.engine.begin() as conn:  # what version 1 looked like
        for column in added:
            conn.exec_driver_sql(f"ALTER TABLE malleable_jobs DROP COLUMN {column}")
        conn.execute(update(schema.meta).where(schema.meta.c.key == "schema_version").values(value="1"))
    store.close()

    upgraded = JobStore(store_url)
    with upgraded.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT value FROM malleable_meta WHERE key = 'schema_version'").scalar() == str(schema.SCHEMA_VERSION)
    row = upgraded.job(job)
    assert (row.name, row.submitter, row.total_samples, row.state) == ("kept", as_recorded(store_url, "old"), 321, JobState.QUEUED)
    assert (row.steps, row.final_loss, row.eval_loss) == (None, None, None)
    assert upgraded.set_state(job, JobState.FINISHED, steps=7, first_loss=2.5, final_loss=0.5, eval_loss=0.75)
    row = upgraded.job(job)
    assert (row.steps, row.first_loss, row.final_loss, row.eval_loss) == (7, 2.5, 0.5, 0.75)
    JobStore(store_url)  # opening it again finds the current version: nothing to do, nothing refused


def test_a_version_2_store_gains_the_wall_split_and_the_per_generation_rates(store_url):
    """Version 3 added a job's wall-time split and each allocation's predicted and measured
    samples/s; a version-2 store keeps its jobs and allocation history and records both."""
    store = JobStore(store_url)
    job = ServiceClient(store, submitter="old").submit(job_entry("kept", samples=321)).job_id
    store.record_allocations([AllocationRow(job, 10.0, 2, 64, "start")])
    with store.engine.begin() as conn:  # what version 2 looked like
        conn.exec_driver_sql("ALTER TABLE malleable_jobs DROP COLUMN wall_split")
        for column in ("predicted_samples_per_s", "measured_samples_per_s"):
            conn.exec_driver_sql(f"ALTER TABLE malleable_allocations DROP COLUMN {column}")
        conn.execute(update(schema.meta).where(schema.meta.c.key == "schema_version").values(value="2"))
    store.close()

    upgraded = JobStore(store_url)
    assert upgraded.allocations(job) == [AllocationRow(job, 10.0, 2, 64, "start", None, None)]
    assert upgraded.job(job).wall_split is None
    upgraded.record_allocations([AllocationRow(job, 20.0, 1, 64, "in_place", predicted_samples_per_s=400.0)])
    upgraded.record_measured_rate(job, 390.5)  # the latest row: the generation that runs now
    assert [(a.predicted_samples_per_s, a.measured_samples_per_s) for a in upgraded.allocations(job)] == [(None, None), (400.0, 390.5)]
    upgraded.update_job(job, wall_split='{"steps_s": 1.5}')
    assert upgraded.job(job).wall_split == {"steps_s": 1.5}


def test_an_unreachable_store_is_one_line_naming_the_setting():
    with pytest.raises(StoreError, match=r"MALLEABLE_JOB_STORE") as info:
        JobStore("postgresql+psycopg://postgres@127.0.0.1:9/none")
    assert "\n" not in str(info.value)
    with pytest.raises(StoreError, match=r"not a database URL"):
        JobStore("not a url://")


def test_one_service_holds_the_lease_a_second_is_refused_a_dead_one_is_taken_over(store_url):
    first, second = Lease(JobStore(store_url), ttl_s=30), Lease(JobStore(store_url), ttl_s=30)
    assert first.acquire().previous is None
    with pytest.raises(LeaseHeldError, match=r"another malleable service \(pid \d+ on"):
        second.acquire()
    first.release()
    assert second.acquire().previous is None  # released cleanly: nothing to fence
    # A holder on this host whose process is gone (kill -9) is taken over before its TTL ends.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    store = JobStore(store_url)
    with store.engine.begin() as conn:
        conn.execute(update(schema.lease).values(holder="crashed", pid=pid, cluster_address="tcp://127.0.0.1:1"))
    taken = Lease(store, ttl_s=30).acquire()
    assert taken.previous is not None and taken.previous.holder == "crashed" and taken.previous.cluster_address == "tcp://127.0.0.1:1"


def test_renewal_fails_once_another_holder_took_the_lease(store_url):
    store = JobStore(store_url)
    lease = Lease(store, ttl_s=30)
    lease.acquire()
    assert lease.renew()
    with store.engine.begin() as conn:
        conn.execute(update(schema.lease).values(holder="someone-else"))
    assert not lease.renew() and lease.lost.is_set()


SUBMITTER = textwrap.dedent(
    """
    import sys
    from service.client import ServiceClient
    from tests.service_helpers import job_entry
    url, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = ServiceClient(url, submitter=who)
    for i in range(n):
        # Every submission twice, as a retried Prefect task would: the key makes it one job.
        for _ in range(2):
            client.submit(job_entry(f"{who}-{i}"), idempotency_key=f"{who}-{i}")
    """
)


def test_two_submitter_processes_at_once_give_every_job_exactly_once(store_url):
    JobStore(store_url)  # created before the race, as a running service would have
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    n = 60
    procs = [subprocess.Popen([sys.executable, "-c", SUBMITTER, store_url, who, str(n)], env=env) for who in ("p1", "p2")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    names = [r.name for r in JobStore(store_url).jobs()]
    expected = {f"{who}-{i}" for who in ("p1", "p2") for i in range(n)}
    assert len(names) == len(expected) == 2 * n and set(names) == expected


def test_submit_many_returns_earlier_jobs_for_known_keys(store_url):
    store = JobStore(store_url)
    subs = [Submission(f"s{i}", spec_from_entry(job_entry(f"s{i}")), "me", f"file:s{i}") for i in range(3)]
    first = store.submit_many(subs)
    second = store.submit_many(subs)
    assert [s.job_id for s in first] == [s.job_id for s in second]
    assert all(s.created for s in first) and not any(s.created for s in second)


def test_a_job_seed_survives_the_store(store_url):
    """What a submitter sets per job (HPO: one per trial and stage) is what the service schedules."""
    client = ServiceClient(store_url)
    seeded = client.submit(job_entry("s", seed=17)).job_id
    plain = client.submit(job_entry("p")).job_id
    assert client.job(seeded).job_spec().seed == 17
    assert client.job(plain).job_spec().seed is None


def test_two_writers_creating_one_experiment_at_once_both_get_it(tmp_path):
    """A flow and the service it submits to start tracking at the same moment: the one whose
    create loses the race reads the winner's experiment instead of failing the flow."""
    from mlflow import MlflowClient

    from service.tracking import ensure_experiment

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    winner = MlflowClient(uri)

    class LateReader:
        """A real client that looked before the winner created it (the interleaving of the race)."""

        def __init__(self) -> None:
            self.client, self.looked = MlflowClient(uri), False

        def get_experiment_by_name(self, name):
            if not self.looked:
                self.looked = True
                return None
            return self.client.get_experiment_by_name(name)

        def create_experiment(self, name, artifact_location=None):
            return self.client.create_experiment(name, artifact_location=artifact_location)

    created = winner.create_experiment("shared")
    assert ensure_experiment(LateReader(), "shared") == created
    assert ensure_experiment(winner, "shared") == created


@pytest.mark.parametrize("async_commit", [False, True])
def test_postgres_submission_is_committed_and_notified_once_when_submit_returns(async_commit):
    """The row and its NOTIFY go in one statement: when ``submit`` returns, another session sees
    the job, a listener hears exactly one notification per submission (none for a submission the
    store refuses), and the store's connection holds no open transaction."""
    psycopg = pytest.importorskip("psycopg")
    url = postgres_url()
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    try:
        store = JobStore(url, async_commit_submissions=async_commit)
        client = ServiceClient(store, submitter="alice@host")
        with psycopg.connect(plain, autocommit=True) as listener, psycopg.connect(plain, autocommit=True) as other:
            listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            ids = [client.submit(job_entry(f"n{i}"), idempotency_key=f"k{i}").job_id for i in range(3)]
            seen = [r[0] for r in other.execute("SELECT id FROM malleable_jobs ORDER BY seq").fetchall()]
            assert seen == ids
            with pytest.raises(IdempotencyConflict):
                client.submit(job_entry("n0", samples=999), idempotency_key="k0")  # same key, other content: refused
            assert client.submit(job_entry("n1"), idempotency_key="k1").created is False  # a retry: no new row
            heard = list(listener.notifies(timeout=2.0, stop_after=10))
            assert len(heard) == 3 and {n.channel for n in heard} == {NOTIFY_CHANNEL}
            states = {r[0] for r in other.execute("SELECT state FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND query NOT ILIKE 'LISTEN%'").fetchall()}
            assert "idle in transaction" not in states
        store.close()
    finally:
        drop_postgres(url)


def test_a_version_4_store_gains_the_code_version(store_url):
    """Version 5 records which code a job started with (issue 35.2); a version-4 store keeps its jobs."""
    store = JobStore(store_url)
    job = ServiceClient(store, submitter="old").submit(job_entry("kept", samples=321)).job_id
    with store.engine.begin() as conn:  # what version 4 looked like
        conn.exec_driver_sql("ALTER TABLE malleable_jobs DROP COLUMN code_version")
        conn.execute(update(schema.meta).where(schema.meta.c.key == "schema_version").values(value="4"))
    store.close()

    upgraded = JobStore(store_url)
    row = upgraded.job(job)
    assert (row.name, row.total_samples, row.code_version) == ("kept", 321, None)
    assert upgraded.set_state(job, JobState.RUNNING, code_version="sha256:" + "ab" * 32)
    assert upgraded.job(job).code_version == "sha256:" + "ab" * 32
