"""Issue 35.6: the PostgreSQL grants docs/service.md gives per role are enough, and no more than
needed: the doc's own SQL block is run on a fresh store, then each command as each role."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.commands.cli import app
from service.store import JobStore
from tests.service_helpers import PG_ADMIN, drop_postgres, postgres_url

REPO = Path(__file__).resolve().parents[1]
MLP = "elastic_tasks.examples:mlp_tiny"


def _doc_sql() -> list[str]:
    text = (REPO / "docs" / "service.md").read_text()
    section = text.split("## PostgreSQL roles and grants", 1)[1]
    block = re.search(r"```sql\n(.*?)```", section, re.S)
    assert block, "no sql block in the section"
    lines = [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("--")]
    return [s.strip() for s in " ".join(lines).split(";") if s.strip()]


@pytest.fixture
def granted(tmp_path):
    import sqlalchemy

    url = postgres_url()
    JobStore(url).close()  # the service's first start: the tables, owned by the service's role
    suffix = uuid.uuid4().hex[:8]
    names = {"malleable_submitters": f"ms_{suffix}", "malleable_watchers": f"mw_{suffix}", "alice": f"alice_{suffix}", "grafana": f"grafana_{suffix}"}
    engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for statement in _doc_sql():
            for doc_name, name in names.items():
                statement = re.sub(rf"\b{doc_name}\b", name, statement)
            conn.exec_driver_sql(statement)
    engine.dispose()
    yield url, names
    drop_postgres(url)
    admin = sqlalchemy.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for name in (names["alice"], names["grafana"], names["malleable_submitters"], names["malleable_watchers"]):
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {name}")
    admin.dispose()


def test_the_documented_grants_let_each_role_do_its_commands_and_no_more(granted, tmp_path):
    url, names = granted

    def as_role(role: str):
        env = {"MALLEABLE_JOB_STORE": url.replace("postgres@", f"{role}:change-this@"), "MALLEABLE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "250"}
        return lambda *args: CliRunner(env=env).invoke(app, list(args))

    alice, grafana = as_role(names["alice"]), as_role(names["grafana"])
    submitted = alice("submit", MLP, "--samples", "1000", "--no-import-check")
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.output.strip().splitlines()[-1].split("\t")[0]
    assert JobStore(url).job(job_id).submitter.startswith(names["alice"])
    listed = grafana("jobs", "--all")
    assert listed.exit_code == 0 and job_id in listed.output, listed.output
    refused = grafana("submit", MLP, "--samples", "1000", "--no-import-check")
    assert refused.exit_code == 2 and "may not submit" in refused.output, refused.output
    refused = grafana("cancel", job_id, "--force")
    assert refused.exit_code == 2 and "may not cancel" in refused.output, refused.output
    cancelled = alice("cancel", job_id)
    assert cancelled.exit_code == 0, cancelled.output
    waited = alice("wait", job_id, "--timeout", "5")
    assert waited.output.split()[:2] == [job_id, "cancelled"], waited.output
    # ... and no more: a submitter cannot write what only the service writes, nor take the lease.
    import sqlalchemy

    engine = sqlalchemy.create_engine(url.replace("postgres@", f"{names['alice']}:change-this@"))
    for statement in ("UPDATE malleable_jobs SET gpus = 8", "DELETE FROM malleable_jobs", "UPDATE malleable_lease SET holder = 'me'"):
        with pytest.raises(sqlalchemy.exc.ProgrammingError, match="permission denied"), engine.begin() as conn:
            conn.exec_driver_sql(statement)
    engine.dispose()
