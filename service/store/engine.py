"""The job store's SQLAlchemy engine: URL checks that answer in one line, sqlite pragmas, pooling.

Apart from ``service.store`` so that the store module stays about jobs, not connections.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from service.redaction import redact_url as redact
from service.store.errors import StoreMissingError, StoreSettingError


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets submitters write while the service reads; NORMAL sync is durable across a
    # process crash (only an OS crash may lose the last commits).
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def in_memory(url: str) -> bool:
    """A sqlite store that ends with the process (``sqlite://``, ``sqlite:///:memory:``)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return False
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def make_engine(url: str, *, create: bool = True) -> Engine:
    """An engine for ``url``; with ``create=False`` a sqlite file that is not there is not made
    (StoreMissingError): a read-only command never creates a store."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreSettingError(f"job store URL {redact(url)!r}: not a database URL (e.g. sqlite:///path/jobs.db, postgresql+psycopg://user@host/db)") from None
    try:
        backend = parsed.get_backend_name()
        parsed.get_dialect()
    except NoSuchModuleError:
        raise StoreSettingError(f"job store URL {redact(url)!r}: no database kind {parsed.drivername!r} (e.g. sqlite:///path/jobs.db, postgresql+psycopg://user@host/db)") from None
    except ModuleNotFoundError as exc:
        raise StoreSettingError(f"job store URL {redact(url)!r}: its driver is not installed ({exc.name})") from None
    if backend == "sqlite":
        try:  # first: a refused URL is named as such, and leaves nothing behind
            engine = create_engine(parsed, connect_args={"timeout": 30})
        except (ValueError, TypeError) as exc:  # e.g. ?timeout=abc: the dialect converts URL arguments here
            raise StoreSettingError(f"job store URL {redact(url)!r}: an argument of the URL is refused ({type(exc).__name__}: {exc}); fix its query string") from None
        if parsed.database and parsed.database != ":memory:":
            path = Path(parsed.database)
            existing = next(p for p in (path.parent, *path.parent.parents) if p.exists())
            if path.is_dir() or not existing.is_dir():
                what = "is a directory" if path.is_dir() else f"{str(existing)!r} is a file, not a directory"
                raise StoreSettingError(f"job store URL {redact(url)!r}: {what}")
            if not create and not path.exists():
                raise StoreMissingError(f"job store {redact(url)!r} does not exist yet (nothing was submitted to it)")
        if parsed.database and parsed.database != ":memory:":
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if not os.access(path.parent, os.W_OK):
                    raise PermissionError(13, "Permission denied")
            except OSError as exc:
                engine.dispose()
                raise StoreSettingError(f"job store URL {redact(url)!r}: cannot make the store file there ({exc.strerror or type(exc).__name__})") from None
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    try:
        # connect_timeout bounds the wait for a server that does not answer (a URL's own wins).
        return create_engine(parsed, pool_pre_ping=True, connect_args={"connect_timeout": 10} if backend == "postgresql" and "connect_timeout" not in parsed.query else {})
    except ModuleNotFoundError as exc:
        raise StoreSettingError(f"job store URL {redact(url)!r}: its driver is not installed ({exc.name})") from None
    except (ValueError, TypeError) as exc:
        raise StoreSettingError(f"job store URL {redact(url)!r}: an argument of the URL is refused ({type(exc).__name__}: {exc}); fix its query string") from None
