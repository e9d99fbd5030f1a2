"""Damaged local state (a truncated sqlite file) is found before it is used, and named.

A SQLite file's header records its page size and page count; a file shorter than that was
cut short (a full disk, a copy interrupted, a crash while it was being moved). SQLite itself
may only notice when a query reaches a missing page, deep inside MLflow or Prefect, so the
CLI checks the header first and says which file and what to do.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

_MAGIC = b"SQLite format 3\x00"


class DamagedStateError(ValueError):
    """A local state file is damaged; the message names it and says what to do."""


def sqlite_damage(path: Path) -> str | None:
    """Why the SQLite file at ``path`` is damaged, or None (also when it does not exist yet)."""
    try:
        size = path.stat().st_size
        if size == 0:
            return None  # a fresh file the store will initialise
        with path.open("rb") as f:
            header = f.read(100)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read it ({exc.strerror})"
    if len(header) < 100 or not header.startswith(_MAGIC):
        return "not a SQLite database"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The in-header page count is valid when "version-valid-for" equals the change counter.
    if header[92:96] == header[24:28] and pages and size < pages * page_size:
        return f"truncated: {size:,} bytes where its header records {pages * page_size:,}"
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        if "locked" in str(exc):
            return None  # in use by another process; not damage
        return str(exc)
    return None


def check_sqlite(path: Path, what: str, move_aside_means: str) -> None:
    """Raise DamagedStateError naming ``path`` and the fix when it is damaged."""
    why = sqlite_damage(path)
    if why is not None:
        # Another process may be mid-commit (header written, file not yet grown): look again.
        time.sleep(0.5)
        why = sqlite_damage(path)
    if why is not None:
        raise DamagedStateError(f"{what} {path} is damaged ({why}); move it aside (mv {path} {path}.damaged): {move_aside_means}")


def prefect_database() -> Path | None:
    """The local sqlite file Prefect's ephemeral API would open, or None (a server, PostgreSQL)."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url:
        return None  # a Prefect server owns its database
    url = settings.server.database.connection_url
    raw = url.get_secret_value() if url is not None else ""
    prefix = raw.split(":///", 1)
    if not raw.startswith("sqlite") or len(prefix) != 2:
        return None
    return Path(os.path.expanduser(prefix[1].split("?", 1)[0]))


def check_prefect_database() -> None:
    path = prefect_database()
    if path is not None:
        check_sqlite(path, "Prefect database", "Prefect makes a new one and forgets only its own flow-run history")
