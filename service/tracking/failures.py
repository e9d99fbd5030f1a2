"""Why an MLflow call failed: the store cannot be used now (journal the call, replay it later), or
MLflow answered and refused this one request (a bad value: replaying it would fail again).

Standard library only at import: ``mlflow`` and ``requests`` are imported when a failure is
classified, so the service loads this room without waiting for MLflow.
"""

from __future__ import annotations

from urllib.parse import urlsplit

# MLflow's error codes for a store that is there but cannot serve now (a database locked, its
# file's directory gone, a server whose database is down): the request itself was fine. Not
# INTERNAL_ERROR: a request that trips a bug fails the same way on every replay, and would hold
# every later call behind it in the journal.
_TRANSIENT_CODES = frozenset({"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"})


class StoreDamagedError(ValueError):
    """A local store found damaged before use (``BufferedTracker``'s ``check_store``); the
    message names the file and says what to do."""


def _chain(exc: BaseException):
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def unreachable(exc: BaseException) -> bool:
    """Did the call fail because the server could not be reached (rather than a bad request)?"""
    import requests
    from mlflow.exceptions import MlflowException

    network = (requests.RequestException, ConnectionError, TimeoutError)
    if isinstance(exc, network):
        return True
    if isinstance(exc, MlflowException):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, network):
            return True
        text = str(exc)
        return "Max retries exceeded" in text or "Connection refused" in text or "timed out" in text
    return False


def host(uri: str) -> str:
    return urlsplit(uri).netloc or uri


def refused(exc: BaseException) -> bool:
    """Did a server answer 403? MLflow's server does so to any client whose Host header its
    ``--allowed-hosts`` does not list (``Invalid Host header``), while ``/health`` still passes."""
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and "error code 403" in str(exc)


def store_damaged(exc: BaseException) -> bool:
    """Is a local store broken (a truncated or corrupt sqlite file) rather than the request bad?"""
    for seen in _chain(exc):
        # sqlite3.DatabaseError and sqlalchemy's DatabaseError (which wraps it) share the name.
        if isinstance(seen, StoreDamagedError) or type(seen).__name__ == "DatabaseError" or "database disk image is malformed" in str(seen) or "file is not a database" in str(seen):
            return True
    return False


def unavailable(exc: BaseException) -> bool:
    """The store cannot be used now: the server is unreachable or the local store is damaged."""
    return unreachable(exc) or store_damaged(exc)


def store_unavailable(exc: BaseException) -> bool:
    """The service's wider reading: besides ``unavailable`` and a 403, any failure of the store
    rather than of the request — a file system error (its directory gone, not writable, a disk
    full), a database that cannot be opened or is locked, MLflow's own "temporarily unavailable"
    — is waited out too. Only MLflow refusing the request itself is not."""
    if unavailable(exc) or refused(exc):
        return True
    for seen in _chain(exc):
        # Not FileNotFoundError: a file to upload that is gone stays gone (the store's own missing
        # directories are created as it opens).
        if (isinstance(seen, OSError) and not isinstance(seen, FileNotFoundError)) or type(seen).__name__ == "OperationalError" or getattr(seen, "error_code", None) in _TRANSIENT_CODES:
            return True
    return False
