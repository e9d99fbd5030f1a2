"""Store failures on a real PostgreSQL (127.0.0.1:5432) and sqlite: each is one line naming the
cause, exit 2, the password never shown (issue 37.4). Every database and role made here is dropped."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.commands.cli import app
from service.store import JobStore
from tests.service_helpers import PG_ADMIN, drop_postgres, postgres_url

# A password with every character a naive pattern stops at: / # ? @ % and a quote.
PASSWORD = "Zq7/p#w?d@x%y'z"


def _admin(sql: str, db: str | None = None) -> None:
    import sqlalchemy

    url = PG_ADMIN if db is None else PG_ADMIN.rsplit("/", 1)[0] + "/" + db
    engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(sql)
    engine.dispose()


@pytest.fixture
def pg(tmp_path, monkeypatch):
    """A fresh database holding a malleable store with one job, and a SELECT-only role on it."""
    monkeypatch.chdir(tmp_path)
    from urllib.parse import quote

    url = postgres_url()
    role = f"i37_ro_{uuid.uuid4().hex[:8]}"
    db = url.rsplit("/", 1)[1]
    try:
        JobStore(url).close()
        # '' quotes a quote in SQL; %% is a literal % for the driver's placeholders.
        _admin(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD.replace(chr(39), chr(39) * 2).replace('%', '%%')}'")
        _admin(f"GRANT CONNECT ON DATABASE {db} TO {role}")
        _admin(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}", db)
        yield url, url.replace("postgresql+psycopg://postgres@", f"postgresql+psycopg://{role}:{quote(PASSWORD, safe='')}@"), db
    finally:
        drop_postgres(url)
        _admin(f"DROP ROLE IF EXISTS {role}")


def _run(*args: str, store: str) -> tuple[int, list[str]]:
    # An allow-list: serve on a shared store warns without one (a line of its own).
    result = CliRunner(env={"COLUMNS": "250", "MALLEABLE_JOB_STORE": store, "MALLEABLE_ALLOWED_ENTRYPOINTS": "elastic_tasks.*"}).invoke(app, list(args))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result.exit_code, lines


def _one_line(code_lines: tuple[int, list[str]], *needles: str) -> str:
    code, lines = code_lines
    assert code == 2 and len(lines) == 1, lines
    for needle in needles:
        assert needle in lines[0], lines
    for form in (PASSWORD, "p#w?d", "%2Fp%23w"):
        assert form not in lines[0], lines
    return lines[0]


def test_a_select_only_role_cannot_serve_or_submit_and_is_told_which_privilege(pg):
    _, ro, _ = pg
    _one_line(_run("serve", "--workers", "1", store=ro), "may not take the scheduler's lease", "permission denied", "lease")
    _one_line(_run("submit", "mlp_tiny", "--samples", "100", "--no-import-check", store=ro), "may not submit", "permission denied")
    code, lines = _run("jobs", store=ro)  # listing is what a read-only role is for
    assert code == 0, lines


def test_read_only_transactions_are_named_as_such(pg):
    url, _, _ = pg
    ro_tx = url + "?options=-c%20default_transaction_read_only%3Don"
    _one_line(_run("submit", "mlp_tiny", "--samples", "100", store=ro_tx), "read-only", "default_transaction_read_only")


def test_dropped_tables_and_a_missing_meta_table_are_not_an_empty_store(pg):
    url, _, db = pg
    _admin("DROP TABLE malleable_allocations", db)
    _one_line(_run("jobs", store=url), "malleable_allocations", "missing")
    _admin("DROP TABLE malleable_meta", db)
    _one_line(_run("jobs", store=url), "malleable_meta", "not a malleable store")
    _one_line(_run("submit", "mlp_tiny", "--samples", "100", store=url), "malleable_meta")


@pytest.mark.parametrize("query", ["bogus=1", "connect_timeout=abc"])
def test_url_arguments_the_driver_refuses_are_one_line(pg, query):
    url, _, _ = pg
    _one_line(_run("jobs", store=f"{url}?{query}"), "argument of the URL", query.split("=")[0])


def test_sqlite_url_arguments_are_refused_before_any_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line(_run("submit", "mlp_tiny", "--samples", "100", store=f"sqlite:///{tmp_path}/sub/jobs.db?timeout=abc"), "argument of the URL", "timeout=abc")
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_server_is_one_line_within_its_connect_timeout(tmp_path, monkeypatch):
    """Nothing listens: refused at once; a bounded wait either way (connect_timeout)."""
    from tests.ports import unclaimed_port

    monkeypatch.chdir(tmp_path)
    port = unclaimed_port()  # nothing listens there, and no port-0 bind is handed it meanwhile
    started = time.monotonic()
    result = CliRunner(env={"MALLEABLE_JOB_STORE": f"postgresql+psycopg://u:{PASSWORD.replace('/', '%2F').replace('#', '%23').replace('?', '%3F').replace('@', '%40')}@127.0.0.1:{port}/x"}).invoke(app, ["jobs"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "unreachable" in lines[0], lines
    assert "Zq7" not in lines[0]
    assert time.monotonic() - started < 60  # a hang check (connect_timeout is 10 s), not a timing goal


def test_submit_refuses_what_a_one_gpu_service_can_never_place_and_non_entry_points(tmp_path, monkeypatch):
    """issue 35.3: the docs' plan example holds profile names (no entry point) and a fixed
    2-GPU job; against a running 1-GPU service each is refused at submit, one line each."""
    import yaml
    from distributed import LocalCluster

    from service.store import schema
    from sqlalchemy import update

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = JobStore(url)
    example = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "jobs.yaml").read_text())
    code, lines = _run("submit", "--file", str(Path(__file__).resolve().parents[1] / "examples" / "jobs.yaml"), store=url)
    assert code == 2 and len(lines) == len(example["jobs"]), lines  # every job's workload is a profile's name
    assert all("not an entry point" in line or "not a training entry point" in line for line in lines), lines
    jobs = {"jobs": [
        {"id": "fits", "workload": "mlp_tiny", "profile": "p", "samples": 100, "min_batch": 8, "max_batch": 64, "max_gpus": 4},
        {"id": "fixed2", "workload": "mlp_tiny", "profile": "p", "samples": 100, "min_batch": 64, "max_batch": 64, "max_gpus": 2, "gpus": 2, "elastic": False},
    ], "profiles": {"p": example_profile()}}  # fmt: skip
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(jobs))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, resources={"GPU": 1}, dashboard_address=None) as cluster:
        with store.engine.begin() as conn:  # a live service on this store, driving that 1-GPU cluster
            conn.execute(update(schema.lease).values(holder="h", host="x", pid=1, expires_at=time.time() + 120, cluster_address=cluster.scheduler_address))
        code, lines = _run("submit", "--file", "two.yaml", store=url)
        assert code == 2 and len(lines) == 1 and "'fixed2'.gpus=2" in lines[0] and "has 1" in lines[0], lines
        assert store.jobs() == []
        code, lines = _run("submit", "--file", "two.yaml", "--no-placement-check", store=url)
        assert code == 0 and len(store.jobs()) == 2, lines


def example_profile() -> dict:
    data = json.loads((Path(__file__).resolve().parents[1] / "examples" / "profiles" / "h100_alexnet-food101.json").read_text())
    return {**data, "workload": "mlp_tiny"}
