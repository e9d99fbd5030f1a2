"""The durable job store: any SQLAlchemy URL (a sqlite file by default, PostgreSQL for a team).

Clients write submissions and cancel requests; the one service holding the lease
(``service.store.lease``) reads them and writes states, allocations and progress back. Every write
is its own short transaction, so submitters and the service never wait on each other for
long; idempotency and "exactly once" rest on the database's unique constraints.
"""

from __future__ import annotations

import getpass
import json
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy import bindparam, func, insert, inspect, select, update
from sqlalchemy.exc import IntegrityError, InternalError, OperationalError, ProgrammingError, SQLAlchemyError

from service.store import schema
from service.jobs.stored import record_for_store, stored_record
from service.redaction import redact_url
from service.store.records import AllocationRow, JobRow, JobState, Submission, Submitted


# Errors and ownership live beside the store; imported here, where callers have always found them.
from service.store.errors import (  # noqa: E402, F401
    MAX_STORED_INT,
    NOTIFY_CHANNEL,
    IdempotencyConflict,
    NotOwnerError,
    StoreError,
    StoreMissingError,
    StorePermissionError,
    StoreSettingError,
    StoreVersionError,
    UnknownJobError,
    not_owner,
    submitter_identity,
)


from service.store.engine import in_memory, make_engine  # noqa: E402, F401  (callers import them from here)
from service.store.failures import store_failure  # noqa: E402


def redact(url: str) -> str:
    return redact_url(url)


def _row(r) -> JobRow:
    return JobRow(
        seq=r.seq, id=r.id, name=r.name, submitter=r.submitter, state=JobState(r.state), spec=stored_record(json.loads(r.spec), r.id),
        submitted_at=r.submitted_at, started_at=r.started_at, finished_at=r.finished_at, updated_at=r.updated_at,
        error=r.error, checkpoint_dir=r.checkpoint_dir, mlflow_run_id=r.mlflow_run_id, board_id=r.board_id,
        gpus=r.gpus, batch=r.batch, samples_done=r.samples_done, total_samples=r.total_samples, attempts=r.attempts,
        cancel_requested=r.cancel_requested, steps=r.steps, first_loss=r.first_loss, final_loss=r.final_loss,
        eval_loss=r.eval_loss, mlflow_parent_run_id=r.mlflow_parent_run_id, wall_split=json.loads(r.wall_split) if r.wall_split else None,
        code_version=r.code_version,
    )  # fmt: skip


def new_job_id() -> str:
    return "j" + uuid.uuid4().hex[:11]


_INSERT_JOB = insert(schema.jobs)
# The columns a submission writes; the rest keep their defaults (NULL until the service fills them).
_SUBMIT_COLUMNS = (
    "id", "name", "submitter", "idempotency_key", "spec", "state", "submitted_at", "updated_at", "total_samples",
    "cancel_requested", "cancel_seen", "gpus", "batch", "samples_done", "attempts", "mlflow_parent_run_id",
)  # fmt: skip
# PostgreSQL: the row and its NOTIFY in one statement (a data-modifying CTE runs exactly once;
# pg_notify is called for the one row it returns). Executed on an autocommit connection, it is
# one round trip and its own transaction: the server answers only after the commit (with the
# server's synchronous_commit, i.e. after the WAL flush), so the job is durable when submit
# returns, and the NOTIFY is delivered with that commit — not before the row is visible.
# Before: BEGIN, INSERT, NOTIFY, COMMIT were four round trips (plus the pool's ping).
_INSERT_JOB_NOTIFY = select(func.pg_notify(NOTIFY_CHANNEL, "")).select_from(
    insert(schema.jobs).values({c: bindparam(f"v_{c}") for c in _SUBMIT_COLUMNS}).returning(schema.jobs.c.seq).cte("inserted")
)


class JobStore:
    """One store; cheap to open (a connection pool), safe to share between threads."""

    def __init__(self, url: str, *, create: bool = True, async_commit_submissions: bool = False) -> None:
        """``async_commit_submissions`` (PostgreSQL): a submission's commit does not wait for its
        WAL flush (``synchronous_commit=off`` for that transaction only): several times the
        submissions per second where an fsync is slow, at the price that a *database server*
        crash within ~0.2 s may lose an acknowledged submission (never half of one; the
        database stays consistent). Retrying with the same idempotency key makes it whole."""
        self.url = url
        self.async_commit_submissions = async_commit_submissions
        self._role: str | None = None
        self.engine = make_engine(url, create=create)
        try:
            self._check_schema(create)
        except StoreError:
            self.engine.dispose()
            raise
        except (SQLAlchemyError, ValueError, TypeError) as exc:  # ValueError/TypeError: a URL argument the driver refuses at connect
            self.engine.dispose()
            raise store_failure(exc, url, "create or open the store" if create else "read the store") from None

    def close(self) -> None:
        self.engine.dispose()

    def _check_schema(self, create: bool) -> None:
        tables = set(inspect(self.engine).get_table_names())
        ours = {t.name for t in schema.metadata.sorted_tables}
        if schema.meta.name in tables and not ours <= tables:
            # Tables dropped from a store: not "an empty store" (its jobs are gone, or elsewhere).
            raise StoreSettingError(
                f"job store {redact(self.url)!r} is damaged: its table(s) {', '.join(sorted(ours - tables))} are missing "
                "(dropped?); restore them from a backup or point MALLEABLE_JOB_STORE at another store"
            )
        if schema.meta.name not in tables and tables & (ours - {schema.meta.name}):
            # Jobs without the meta table: a damaged store (or another program's tables), never read as empty.
            raise StoreSettingError(
                f"job store {redact(self.url)!r}: has table(s) {', '.join(sorted(tables & ours))} but no {schema.meta.name!r} table: "
                "not a malleable store, or a damaged one (its schema version is lost); point MALLEABLE_JOB_STORE elsewhere"
            )
        if schema.meta.name not in tables:
            if not create:
                raise StoreMissingError(f"job store {redact(self.url)!r} holds no malleable jobs (start `malleable serve` or submit once to create it)")
            try:
                schema.metadata.create_all(self.engine)
                with self.engine.begin() as conn:
                    conn.execute(insert(schema.meta).values(key="schema_version", value=str(schema.SCHEMA_VERSION)))
                    conn.execute(insert(schema.lease).values(name="scheduler", expires_at=0.0, cluster_owned=False))
            except IntegrityError:
                pass  # another process created it at the same moment
        with self.engine.connect() as conn:
            found = conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")).scalar()
        if found is not None and found.isdigit() and 1 <= int(found) < schema.SCHEMA_VERSION:
            found = self._upgrade(int(found))
        if found != str(schema.SCHEMA_VERSION):
            raise StoreVersionError(
                f"job store {redact(self.url)!r} has schema version {found}, this malleable uses {schema.SCHEMA_VERSION}: "
                "use a store made by this version (MALLEABLE_JOB_STORE) or the malleable that made it"
            )

    def _upgrade(self, version: int) -> str:
        """An older store, upgraded in place: the columns each later version added (nullable, so
        every row stays valid), and the version, in one transaction."""
        with self.engine.begin() as conn:
            # Another process may have upgraded it meanwhile: re-read under the transaction.
            current = int(conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")).scalar())
            for table, added in ((schema.jobs, schema.ADDED_COLUMNS), (schema.allocations, schema.ADDED_ALLOCATION_COLUMNS)):
                have = {c["name"] for c in inspect(conn).get_columns(table.name)}
                for v in range(current + 1, schema.SCHEMA_VERSION + 1):
                    for name in added.get(v, ()):
                        if name in have:
                            continue
                        kind = table.c[name].type.compile(dialect=conn.dialect)
                        # PostgreSQL: a second process upgrading at the same moment waits on the table
                        # lock, then finds the column there.
                        exists = " IF NOT EXISTS" if conn.dialect.name == "postgresql" else ""
                        conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN{exists} {name} {kind}")
            conn.execute(update(schema.meta).where(schema.meta.c.key == "schema_version").values(value=str(schema.SCHEMA_VERSION)))
        return str(schema.SCHEMA_VERSION)

    # -- clients ---------------------------------------------------------------------------------

    def submit(self, submission: Submission) -> Submitted:
        return self.submit_many([submission])[0]

    def submit_many(self, submissions: Sequence[Submission]) -> list[Submitted]:
        """In order; a known idempotency key returns its earlier job."""
        out: list[Submitted] = []
        for sub in submissions:
            out.append(self._submit_one(sub))
        return out

    @contextmanager
    def writing(self, operation: str) -> Iterator[None]:
        """A write refused by the database's permissions: one StorePermissionError naming the
        role and ``operation`` (a read-only watcher role may list and wait, not submit)."""
        try:
            yield
        except (ProgrammingError, OperationalError, InternalError) as exc:
            text = str(exc.orig or exc).lower()
            if "permission denied" not in text and "insufficientprivilege" not in type(exc.orig).__name__.lower() and "read" not in text:
                raise
            raise store_failure(exc, self.url, operation, self.role()) from None

    def role(self) -> str:
        """Who the database says we are: PostgreSQL's ``current_user``; on a file, the OS user."""
        if self.engine.dialect.name == "postgresql":
            if self._role is None:
                with self.engine.connect() as conn:
                    self._role = str(conn.exec_driver_sql("SELECT current_user").scalar())
            return self._role
        return getpass.getuser()

    def _check_key(self, sub: Submission) -> str | None:
        """The job an idempotency key already names, if its content is this submission's;
        IdempotencyConflict if the key names a different job (a retry never changes the job)."""
        with self.engine.connect() as conn:
            found = conn.execute(select(schema.jobs.c.id, schema.jobs.c.spec, schema.jobs.c.name).where(schema.jobs.c.idempotency_key == sub.idempotency_key)).first()
        if found is None:
            return None
        # The profile is left out: a retry may find a newer measured profile; the work is the same.
        before = {k: v for k, v in stored_record(json.loads(found.spec), found.id).items() if k != "profile"}
        now = {k: v for k, v in json.loads(json.dumps(record_for_store(sub.spec, found.id))).items() if k != "profile"}
        differ = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k)) + (["name"] if found.name != sub.name else [])
        if differ:
            raise IdempotencyConflict(
                f"--key={sub.idempotency_key!r}: already names job {found.id} with other content ({', '.join(differ)} differ); a different job needs a new key"
            )
        return found.id

    def _submit_one(self, sub: Submission) -> Submitted:
        if sub.idempotency_key is not None:
            earlier = self._check_key(sub)
            if earlier is not None:
                return Submitted(earlier, created=False)
        total = sub.spec.total_samples
        if not 0 < total <= MAX_STORED_INT:
            raise ValueError(f"samples={total!r}: must be an integer in [1, {MAX_STORED_INT}] (what the store holds)")
        job_id, now = sub.spec.id if sub.keep_id else new_job_id(), time.time()
        values = dict(
            id=job_id, name=sub.name, submitter=sub.submitter, idempotency_key=sub.idempotency_key, spec=json.dumps(record_for_store(sub.spec, job_id)),
            state=JobState.QUEUED.value, submitted_at=now, updated_at=now, total_samples=total,
            cancel_requested=False, cancel_seen=False, gpus=0, batch=0, samples_done=0.0, attempts=0,
            mlflow_parent_run_id=sub.mlflow_parent_run_id,
        )  # fmt: skip
        try:
            with self.writing("submit jobs"):
                self._insert_job(values)
        except IntegrityError:
            # Two retries of one submission raced: the other insert won; return its job.
            earlier = self._check_key(sub) if sub.idempotency_key is not None else None
            if earlier is None:
                raise
            return Submitted(earlier, created=False)
        return Submitted(job_id, created=True)

    def _insert_job(self, values: dict[str, object]) -> None:
        """One job row, committed when this returns; on PostgreSQL with its NOTIFY, in one round trip."""
        if self.engine.dialect.name != "postgresql":
            with self.engine.begin() as conn:
                conn.execute(_INSERT_JOB, values)  # parameters apart: one cached compiled statement for every submit
            return
        params = {f"v_{k}": v for k, v in values.items()}
        if self.async_commit_submissions:
            # SET LOCAL needs a transaction of its own to apply to (see __init__ for the trade-off).
            with self.engine.begin() as conn:
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO off")
                conn.execute(_INSERT_JOB_NOTIFY, params)
            return
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(_INSERT_JOB_NOTIFY, params)

    def _notify(self, conn) -> None:
        # PostgreSQL wakes a LISTENing service at once (with the commit); sqlite has no such thing.
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"NOTIFY {NOTIFY_CHANNEL}")

    def job(self, job_id: str) -> JobRow:
        with self.engine.connect() as conn:
            r = conn.execute(select(schema.jobs).where(schema.jobs.c.id == job_id)).first()
        if r is None:
            raise UnknownJobError(job_id)
        return _row(r)

    def jobs(self, states: Iterable[JobState] | None = None, ids: Iterable[str] | None = None, after_seq: int = 0) -> list[JobRow]:
        """Jobs in submission order, optionally only those in ``states`` / with ``ids`` / after ``after_seq``."""
        query = select(schema.jobs).where(schema.jobs.c.seq > after_seq).order_by(schema.jobs.c.seq)
        if states is not None:
            query = query.where(schema.jobs.c.state.in_([s.value for s in states]))
        if ids is not None:
            query = query.where(schema.jobs.c.id.in_(list(ids)))
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(query)]

    def request_cancel(self, job_id: str, *, by: str | None = None, force: bool = False) -> JobRow:
        """A job that has not started is cancelled at once; a running one when the service stops it.
        ``by`` (a submitter): another submitter's job only with ``force``, and that is recorded on the job."""
        now = time.time()
        with self.writing("cancel jobs"), self.engine.begin() as conn:
            found = conn.execute(select(schema.jobs.c.state, schema.jobs.c.submitter).where(schema.jobs.c.id == job_id)).first()
            if found is None:
                raise UnknownJobError(job_id)
            foreign = by is not None and submitter_identity(found.submitter) != submitter_identity(by)
            if foreign and not force:
                raise not_owner(job_id, found.submitter, by)
            if not JobState(found.state).terminal:
                extra = {"error": f"cancelled by {by} with --force"} if foreign else {}
                conn.execute(update(schema.jobs).where(schema.jobs.c.id == job_id).values(cancel_requested=True, updated_at=now, **extra))
                self._notify(conn)
                conn.execute(
                    update(schema.jobs)
                    .where(schema.jobs.c.id == job_id, schema.jobs.c.state.in_([JobState.QUEUED.value, JobState.SUSPENDED.value]))
                    .values(state=JobState.CANCELLED.value, finished_at=now)
                )
        return self.job(job_id)

    def allocations(self, job_id: str) -> list[AllocationRow]:
        query = select(schema.allocations).where(schema.allocations.c.job_id == job_id).order_by(schema.allocations.c.seq)
        with self.engine.connect() as conn:
            return [
                AllocationRow(r.job_id, r.time, r.gpus, r.batch, r.kind, r.predicted_samples_per_s, r.measured_samples_per_s) for r in conn.execute(query)
            ]

    # -- the service -----------------------------------------------------------------------------

    def take_cancel_requests(self) -> list[str]:
        """Cancel requests the service has not acted on yet; each returned once."""
        c = schema.jobs.c
        with self.engine.begin() as conn:
            # "= true", not "IS true": PostgreSQL uses the (cancel_requested, cancel_seen) index only for "=".
            ids = list(conn.execute(select(c.id).where(c.cancel_requested == True, c.cancel_seen == False)).scalars())  # noqa: E712
            if ids:
                conn.execute(update(schema.jobs).where(c.id.in_(ids)).values(cancel_seen=True))
        return ids

    def set_state(self, job_id: str, state: JobState, *, only_from: Sequence[JobState] | None = None, **fields: object) -> bool:
        """Move a job to ``state`` (with extra columns); with ``only_from``, only from those states.
        False if the job was elsewhere (e.g. a client cancelled it meanwhile)."""
        now = time.time()
        values: dict[str, object] = {"state": state.value, "updated_at": now, **fields}
        if state is JobState.RUNNING:
            values.setdefault("started_at", now)
        if state.terminal:
            values.setdefault("finished_at", now)
            values.setdefault("gpus", 0)
            values.setdefault("batch", 0)
        query = update(schema.jobs).where(schema.jobs.c.id == job_id)
        if only_from is not None:
            query = query.where(schema.jobs.c.state.in_([s.value for s in only_from]))
        with self.engine.begin() as conn:
            return conn.execute(query.values(**values)).rowcount == 1

    def update_job(self, job_id: str, **fields: object) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(schema.jobs).where(schema.jobs.c.id == job_id).values(updated_at=time.time(), **fields))

    def record_allocations(self, rows: Sequence[AllocationRow]) -> None:
        """Append to the allocation history and set each job's current GPUs and batch, in one transaction."""
        if not rows:
            return
        with self.engine.begin() as conn:
            conn.execute(
                insert(schema.allocations),
                [dict(job_id=r.job_id, time=r.time, gpus=r.gpus, batch=r.batch, kind=r.kind, predicted_samples_per_s=r.predicted_samples_per_s) for r in rows],
            )
            c = schema.jobs.c
            query = update(schema.jobs).where(c.id == bindparam("job_id")).values(gpus=bindparam("g"), batch=bindparam("b"), updated_at=bindparam("t"))
            conn.execute(query, [{"job_id": r.job_id, "g": r.gpus, "b": r.batch, "t": r.time} for r in rows])

    def record_measured_rate(self, job_id: str, samples_per_s: float) -> None:
        """The samples/s the job's current generation (its latest allocation row) measured."""
        a = schema.allocations
        with self.engine.begin() as conn:
            latest = conn.execute(select(a.c.seq).where(a.c.job_id == job_id).order_by(a.c.seq.desc()).limit(1)).scalar()
            if latest is not None:
                conn.execute(update(a).where(a.c.seq == latest).values(measured_samples_per_s=samples_per_s))

    def record_progress(self, progress: dict[str, float]) -> None:
        if not progress:
            return
        now = time.time()
        c = schema.jobs.c
        # One statement, executed for many rows in one transaction (the driver batches it).
        query = update(schema.jobs).where(c.id == bindparam("job_id")).values(samples_done=bindparam("done"), updated_at=now)
        with self.engine.begin() as conn:
            conn.execute(query, [{"job_id": job_id, "done": samples} for job_id, samples in progress.items()])
