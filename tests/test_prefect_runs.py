"""Issue 35.7: short commands start no Prefect API they do not need. `run --simulate` records a
Prefect flow run only where an API is configured (or MALLEABLE_PREFECT_RUNS=always); MLflow
records it either way. The ephemeral API leaves its database in $PREFECT_HOME: its absence is
the proof that none started."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from flows.prefect_runs import record_in_prefect

REPO = Path(__file__).resolve().parents[1]


def test_auto_records_where_an_api_is_configured():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: "http://prefect.example:4200/api"}):
        assert record_in_prefect("auto") is True and record_in_prefect("never") is False
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert record_in_prefect("auto") is False and record_in_prefect("always") is True


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "always"])
def test_run_simulate_starts_prefect_only_when_asked(tmp_path, mode, migrated_prefect_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLEABLE_", "MLFLOW_", "PREFECT_"))}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect"), MALLEABLE_PREFECT_RUNS=mode)
    if mode == "always":  # the ephemeral API then starts on a migrated copy (its flow run is the only one there)
        migrated_prefect_home(tmp_path / "prefect")
    done = subprocess.run(
        [sys.executable, "-m", "flows.commands.cli", "run", str(REPO / "examples" / "quickstart" / "jobs.yaml"), "--simulate"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "job-a" in done.stdout and "MLflow parent run" in done.stdout
    with sqlite3.connect(tmp_path / ".malleable" / "mlflow.db") as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] >= 1
    prefect_db = tmp_path / "prefect" / "prefect.db"
    if mode == "auto":
        assert not prefect_db.exists()
    else:
        with sqlite3.connect(prefect_db) as db:
            flows = [row[0] for row in db.execute("SELECT f.name FROM flow_run r JOIN flow f ON r.flow_id = f.id WHERE r.state_type = 'COMPLETED'")]
            artifacts = db.execute("SELECT COUNT(*) FROM artifact").fetchone()[0]
        assert flows == ["simulate"] and artifacts >= 3
