"""What the job store raises, and who owns a job (for ``cancel``'s ``--force``)."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store cannot be used; the message is one line naming the URL and what to do."""


class StoreVersionError(StoreError):
    """The store was written by another schema version."""


class StoreSettingError(StoreError):
    """The store's URL itself is wrong (bad input, exit 2): no database, no driver, a bad path, ``:memory:``."""


class StoreMissingError(StoreError):
    """No store at the URL, and the caller only reads: nothing was created."""


class StorePermissionError(StoreError):
    """The database role may not do this (e.g. a read-only watcher submitting)."""


class IdempotencyConflict(ValueError):
    """An idempotency key already names a different job."""


class NotOwnerError(PermissionError):
    """Cancelling another submitter's job without ``force``."""


def submitter_identity(submitter: str) -> str:
    """Who a submitter is for ownership: the database role on PostgreSQL ("role (user@host)"),
    else the whole "user@host"."""
    return submitter.split(" (", 1)[0]


def not_owner(job_id: str, submitter: str, by: str | None) -> NotOwnerError:
    from service.display import shown

    return NotOwnerError(f"JOB_ID={job_id!r}: submitted by {shown(submitter)!r}, not by {shown(by)!r}; cancel another submitter's job with --force (recorded on the job)")


NOTIFY_CHANNEL = "malleable_jobs"

# What an INTEGER column holds on sqlite and PostgreSQL (BIGINT): a job's samples beyond it cannot be stored.
MAX_STORED_INT = 2**63 - 1


class UnknownJobError(KeyError):
    def __str__(self) -> str:
        return f"no job {self.args[0]!r} in the store"
