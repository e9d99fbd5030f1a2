"""The Python client: submit, list, cancel and wait for jobs of a (running or not yet started) service.

Submitting writes into the job store, so it works whether or not a service is up; the
service picks jobs up within its poll interval. See docs/service.md for why the store is
the transport rather than an HTTP API.
"""

from __future__ import annotations

import getpass
import logging
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from allocator.types import JobSpec
from service.jobs.jobspec import spec_from_entry
from service.jobs.limits import check_name
from service.jobs.priors import with_profile
from service.store.records import JobRow, JobState, Submission, Submitted
from service.store import JobStore, not_owner, submitter_identity

log = logging.getLogger(__name__)


def default_submitter() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


class ServiceClient:
    """``profile_cache_dir``: where ``submit`` looks for a job's measured profile when the entry has
    none (``malleable profile`` and the retrain flow write ``<state dir>/profiles``); without one,
    or with nothing cached, it plans with a neutral prior, as ``malleable submit`` does."""

    def __init__(self, store: JobStore | str, submitter: str | None = None, profile_cache_dir: Path | str | None = None) -> None:
        self.store = JobStore(store) if isinstance(store, str) else store
        free = submitter or default_submitter()
        # Where the database knows who is connected (PostgreSQL's current_user), that is who
        # submits: the free text only says from where.
        self.submitter = f"{self.store.role()} ({free})" if self.store.engine.dialect.name == "postgresql" else free
        self.profile_cache_dir = None if profile_cache_dir is None else Path(profile_cache_dir)

    def submit(self, entry: dict, *, name: str | None = None, idempotency_key: str | None = None) -> Submitted:
        """One job as a jobs-file entry (its profile inline, else cached or a prior); ValueError naming the field if invalid."""
        entry, note = with_profile(entry, self.profile_cache_dir)
        spec = spec_from_entry(entry)
        if note is not None:
            log.warning(note)
        return self.submit_spec(spec, name=name, idempotency_key=idempotency_key)

    def submit_specs(self, specs: Sequence[JobSpec], *, key_prefix: str | None = None, keep_ids: bool = False) -> list[Submitted]:
        """JobSpecs (e.g. a jobs file's); ``key_prefix`` + job id makes each idempotent. ``keep_ids``:
        stored under their own ids (a store private to one run; see ``Submission.keep_id``)."""
        subs = [
            Submission(s.id, s, self.submitter, None if key_prefix is None else f"{key_prefix}:{s.id}", keep_id=keep_ids)
            for s in specs
        ]
        return self.store.submit_many(subs)

    def submit_spec(self, spec: JobSpec, *, name: str | None = None, idempotency_key: str | None = None, mlflow_parent_run_id: str | None = None) -> Submitted:
        """One JobSpec, parsed and checked where it entered; ``mlflow_parent_run_id`` nests the job's MLflow run under that run."""
        check_name(name, "name")
        return self.store.submit(Submission(name or spec.id, spec, self.submitter, idempotency_key, mlflow_parent_run_id))

    def job(self, job_id: str) -> JobRow:
        return self.store.job(job_id)

    def jobs(self, states: Iterable[JobState] | None = None, ids: Iterable[str] | None = None) -> list[JobRow]:
        return self.store.jobs(states=states, ids=ids)

    def cancel_allowed(self, job_id: str) -> None:
        """NotOwnerError if ``job_id`` is another submitter's (UnknownJobError if there is none)."""
        row = self.store.job(job_id)
        if submitter_identity(row.submitter) != submitter_identity(self.submitter):
            raise not_owner(job_id, row.submitter, self.submitter)

    def cancel(self, job_id: str, *, force: bool = False) -> JobRow:
        """NotOwnerError for another submitter's job unless ``force`` (recorded on the job)."""
        return self.store.request_cancel(job_id, by=self.submitter, force=force)

    def wait(self, job_ids: Sequence[str], timeout_s: float | None = None, poll_s: float = 0.5) -> list[JobRow]:
        """Block until every job is finished, failed, cancelled or dropped; TimeoutError after ``timeout_s``."""
        for job_id in job_ids:
            self.store.job(job_id)  # UnknownJobError now, not after waiting
        return wait_until_done(lambda: self.store.jobs(ids=job_ids), timeout_s, poll_s)


def wait_until_done(read: Callable[[], list[JobRow]], timeout_s: float | None, poll_s: float, tick: Callable[[], None] | None = None) -> list[JobRow]:
    """Poll ``read`` every ``poll_s`` until every row it returns is terminal (the rows then);
    TimeoutError naming the rest after ``timeout_s``. ``tick`` runs before each read (what a
    caller must do meanwhile; an exception from it ends the wait)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if tick is not None:
            tick()
        rows = read()
        if all(r.state.terminal for r in rows):
            return rows
        if deadline is not None and time.monotonic() > deadline:
            left = [r.id for r in rows if not r.state.terminal]
            raise TimeoutError(f"jobs {', '.join(left)} not done within {timeout_s:g} s")
        time.sleep(poll_s)
