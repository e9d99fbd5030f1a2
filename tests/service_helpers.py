"""Job-store fixtures shared by the service tests: sqlite in a temporary directory, and
PostgreSQL on 127.0.0.1:5432 when reachable (a fresh database per test), skipped elsewhere."""

from __future__ import annotations

import uuid

import pytest

from allocator.profiles.io import profile_to_dict
from tests.factories import make_profile

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def postgres_url() -> str:
    """A fresh, empty database on the local server (dropped by the caller's fixture)."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    try:
        engine = sqlalchemy.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            name = f"malleable_test_{uuid.uuid4().hex[:10]}"
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - no server here: the test says so and skips
        pytest.skip(f"PostgreSQL not reachable at 127.0.0.1:5432 ({type(exc).__name__})")
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name


def drop_postgres(url: str) -> None:
    import sqlalchemy

    name = url.rsplit("/", 1)[1]
    engine = sqlalchemy.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    engine.dispose()


def job_entry(job_id: str = "job", samples: int = 1000, **overrides: object) -> dict:
    entry = {
        "id": job_id,
        "workload": "elastic_tasks.examples:mlp_tiny",
        "profile": profile_to_dict(make_profile()),
        "samples": samples,
        "min_batch": 16,
        "max_batch": 64,
        "max_gpus": 2,
    }
    entry.update(overrides)
    return entry
