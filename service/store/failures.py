"""A database failure as one line naming its cause (issue 37.4).

What a driver raises is read by kind — the SQLSTATE class PostgreSQL gives, the words sqlite
uses — not by where it happened: a URL argument the driver refuses, every transaction
read-only, a privilege the role lacks, a table that is missing, a server that does not answer.
The line names the store (password hidden), the cause and what to do; the exception class says
the exit code (``StoreSettingError``/``StorePermissionError``: the setting or the role is wrong,
exit 2; ``StoreError``: the server, exit 1).
"""

from __future__ import annotations

from service.redaction import redact_text, redact_url
from service.store.errors import StoreError, StorePermissionError, StoreSettingError


def _reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return redact_text(text)[:300]


def _sqlstate(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")


def store_failure(exc: BaseException, url: str, operation: str, role: str | None = None) -> StoreError:
    """The StoreError (one line) for ``exc``, raised while the store at ``url`` did ``operation``."""
    where = f"job store {redact_url(url)!r}"
    reason = _reason(exc)
    low = reason.lower()
    state = _sqlstate(exc)
    who = f"role {role!r}" if role else "this role"
    if isinstance(exc, (ValueError, TypeError)) and not hasattr(exc, "orig"):
        return StoreSettingError(f"{where}: an argument of the URL is refused by the driver ({reason}); fix MALLEABLE_JOB_STORE's query string")
    if "invalid connection option" in low or "bad value for" in low or "invalid dsn" in low or "invalid integer value" in low or "invalid value for parameter" in low:
        return StoreSettingError(f"{where}: an argument of the URL is refused by the driver ({reason}); fix MALLEABLE_JOB_STORE's query string")
    if state == "25006" or "read-only transaction" in low or "readonly database" in low or "attempt to write a readonly" in low:
        return StorePermissionError(
            f"{where}: every transaction is read-only ({reason}); cannot {operation}: use a writable server/role "
            "(not a standby; no default_transaction_read_only in the URL's options or the role's settings)"
        )
    if state == "42501" or "permission denied" in low or "insufficientprivilege" in type(getattr(exc, "orig", exc)).__name__.lower():
        return StorePermissionError(f"{where}: {who} may not {operation} ({reason}); grant it, or use a role that may (docs/service.md)")
    if state == "42P01" or "no such table" in low or ("relation" in low and "does not exist" in low):
        return StoreSettingError(
            f"{where}: a table of the job store is missing ({reason}): it was dropped or this is not a malleable store; "
            "point MALLEABLE_JOB_STORE at a malleable store, or a new database"
        )
    if state.startswith("08") or "could not connect" in low or "connection failed" in low or "connection to server" in low or "connection refused" in low or "timeout expired" in low or "unable to open database" in low:
        return StoreError(f"{where} is unreachable: {reason} (setting MALLEABLE_JOB_STORE)")
    return StoreError(f"{where}: cannot {operation}: {type(getattr(exc, 'orig', None) or exc).__name__}: {reason} (setting MALLEABLE_JOB_STORE)")
