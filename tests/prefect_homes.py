"""Prefect homes whose database is already migrated, for tests that start a Prefect API of their own.

A Prefect API on a fresh sqlite database runs every alembic migration before it answers: ~18 CPU
seconds to become healthy on a 2-core machine, ~10 on a database already at the head revision.
Migrating is Prefect's work, not ours, so the suite migrates one database per Prefect release
(kept in pytest's cache, where a later run finds it) and each such test starts from a copy.
tests/test_flows_quickstart.py and the damaged-database test keep a fresh home: what a newcomer's
first command does, migrations included, stays tested there.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

from filelock import FileLock

BIN = Path(sys.executable).parent
# Where Prefect's database lives in a PREFECT_HOME (its default connection URL).
DATABASE = "prefect.db"


def schema_key() -> str:
    """Names the database's schema: the Prefect release and its sqlite migrations (a migration added
    without a release, as in a development install, still makes a new template)."""
    # Found, not imported: importing Prefect's server costs seconds a test of a server subprocess needs not.
    package = Path(importlib.util.find_spec("prefect").origin).parent
    names = "\n".join(sorted(p.name for p in (package / "server" / "database" / "_migrations" / "versions" / "sqlite").glob("*.py")))
    return f"{importlib.metadata.version('prefect')}-{hashlib.sha256(names.encode()).hexdigest()[:12]}"


def _at_head(db: Path) -> bool:
    """Whether ``db`` is a whole sqlite file that a migration run finished (a run killed mid-way
    leaves no file here: it is written elsewhere and renamed into place)."""
    try:
        # immutable: a reader that leaves no -wal or -shm file beside the template
        with closing(sqlite3.connect(f"file:{db}?immutable=1", uri=True)) as conn:
            return conn.execute("SELECT COUNT(*) FROM alembic_version").fetchone()[0] == 1
    except sqlite3.Error:
        return False


def _migrate(target: Path) -> None:
    """Prefect's own command migrates a database in a throw-away home; a consistent copy (sqlite's
    backup, whatever its journal holds) is then renamed to ``target``."""
    with tempfile.TemporaryDirectory(prefix="malleable-prefect-migrate-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PREFECT_HOME=home, PREFECT_SERVER_ANALYTICS_ENABLED="false")
        subprocess.run([str(BIN / "prefect"), "server", "database", "upgrade", "-y"], env=env, check=True, capture_output=True, timeout=600)
        partial = target.with_suffix(f".{os.getpid()}.partial")
        with closing(sqlite3.connect(Path(home) / DATABASE)) as src, closing(sqlite3.connect(partial)) as dst:
            src.backup(dst)
        os.replace(partial, target)


def migrated_template(cache_dir: Path) -> Path:
    """A migrated database for this Prefect, made once in ``cache_dir`` (test processes running in
    parallel wait for the one that makes it)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = schema_key()
    target = cache_dir / f"{key}.db"
    with FileLock(str(cache_dir / f"{key}.lock")):
        if not _at_head(target):
            _migrate(target)
    return target


def seed_home(home: Path, template: Path, name: str = DATABASE) -> Path:
    """``home`` (made if missing) with a copy of ``template`` as its Prefect database, ``name``."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, home / name)
    return home
