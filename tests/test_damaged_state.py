"""Damaged local state: real SQLite files truncated here, a journal with a torn last line.

Each is found and named with what to do, never a traceback, and a run's records reach
MLflow (or the journal, then MLflow once the store is moved aside)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.config.local_state import sqlite_damage
from flows.recording.run_guard import RunGuard
from flows.recording.tracking import MetricPoint, Tracker

REPO = Path(__file__).resolve().parents[1]


def _sqlite_file(path: Path, rows: int = 3000) -> Path:
    """A real SQLite database of many pages."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", ((i, "x" * 200) for i in range(rows)))
    conn.close()
    return path


def _truncate(path: Path, fraction: float) -> None:
    os.truncate(path, int(path.stat().st_size * fraction))


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.99])
def test_truncated_sqlite_is_found(tmp_path, fraction):
    db = _sqlite_file(tmp_path / "a.db")
    assert sqlite_damage(db) is None
    _truncate(db, fraction)
    why = sqlite_damage(db)
    assert why is not None and "truncated" in why


def test_not_sqlite_missing_and_empty(tmp_path):
    (tmp_path / "junk.db").write_bytes(b"\x00\xff" * 300)
    assert sqlite_damage(tmp_path / "junk.db") == "not a SQLite database"
    assert sqlite_damage(tmp_path / "missing.db") is None
    (tmp_path / "empty.db").write_bytes(b"")
    assert sqlite_damage(tmp_path / "empty.db") is None


def _store(tmp_path: Path) -> tuple[str, Path]:
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    t = Tracker(uri, "exp", tmp_path / "buffer.jsonl")
    t.end_run(t.start_run("before"))  # a real store with tables and a run
    return uri, db


def _next_command() -> None:
    """Each CLI command is a new process; mlflow caches a store and an engine per URI in a process: forget them."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    _tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    for engine in SqlAlchemyStore._engine_map.values():
        engine.dispose()
    SqlAlchemyStore._engine_map.clear()


def _runs(uri: str, name: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("exp")
    return [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == name] if exp else []


def _log_while_damaged(tmp_path: Path, uri: str, told: list[str], values: list[float]) -> None:
    t = Tracker(uri, "exp", tmp_path / "buffer.jsonl", notify=told.append)
    run = t.start_run("during", params={"p": 7})
    t.log_metrics(run, [MetricPoint("loss", v, i) for i, v in enumerate(values)])
    t.end_run(run)


def test_truncated_mlflow_store_buffers_then_replays(tmp_path):
    uri, db = _store(tmp_path)
    _truncate(db, 0.6)
    _next_command()
    told: list[str] = []
    values = [1.0, 0.5, 0.25]
    _log_while_damaged(tmp_path, uri, told, values)  # no exception: the calls are journaled
    assert len(told) == 1 and str(db) in told[0] and "move it aside" in told[0] and "truncated" in told[0], told
    assert (tmp_path / "buffer.jsonl").stat().st_size > 0
    db.rename(db.with_name("mlflow.db.damaged"))  # what the message says to do
    _next_command()
    t = Tracker(uri, "exp", tmp_path / "buffer.jsonl", notify=told.append)
    assert t.flush()
    [run] = _runs(uri, "during")
    history = MlflowClient(uri).get_metric_history(run.info.run_id, "loss")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == values
    assert run.data.params == {"p": "7"} and run.info.status == "FINISHED"


def test_torn_last_journal_line_is_skipped_and_the_rest_kept(tmp_path):
    uri, db = _store(tmp_path)
    _truncate(db, 0.6)
    _next_command()
    told: list[str] = []
    _log_while_damaged(tmp_path, uri, told, [3.0, 2.0])
    journal = tmp_path / "buffer.jsonl"
    whole = journal.read_text().count("\n")
    with journal.open("a") as f:
        f.write('{"op": "log_batch", "run": "offline-')  # a write cut short by a crash
    db.unlink()
    _next_command()
    t = Tracker(uri, "exp", journal, notify=told.append)
    assert t.flush()
    assert any("skipped 1 damaged line" in m and f"{whole} buffered call(s) kept" in m for m in told), told
    [run] = _runs(uri, "during")
    assert [m.value for m in MlflowClient(uri).get_metric_history(run.info.run_id, "loss")] == [3.0, 2.0]
    assert not journal.exists()


def test_compare_names_a_damaged_store(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.commands.cli import app

    (tmp_path / ".malleable").mkdir()
    _store_dir = tmp_path / ".malleable"
    uri, db = _store(_store_dir)
    monkeypatch.chdir(tmp_path)
    _truncate(db, 0.5)
    _next_command()
    result = CliRunner(env={"COLUMNS": "250", "MALLEABLE_TRACKING_URI": uri}).invoke(app, ["compare"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert str(db) in lines[0] and "damaged" in lines[0] and "mv " in lines[0]


def test_damaged_prefect_database_is_one_line(tmp_path):
    """Prefect's own sqlite file, truncated: a Prefect command stops before any flow, naming it."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    db = _sqlite_file(home / "prefect.db")
    _truncate(db, 0.5)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": "",
        "COLUMNS": "250",
    }
    env.pop("PREFECT_API_DATABASE_CONNECTION_URL", None)
    env.pop("PREFECT_SERVER_DATABASE_CONNECTION_URL", None)
    # quickstart: a command that runs a flow (compare reads MLflow only and needs no Prefect).
    proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", "quickstart"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(out) == 1 and "Traceback" not in proc.stderr, out
    assert "Prefect database" in out[0] and str(db) in out[0] and "mv " in out[0]


@pytest.mark.parametrize(("error", "status"), [(RuntimeError("trial failed"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
def test_runs_cut_short_are_ended_not_left_running(tmp_path, error, status):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    t = Tracker(uri, "exp", tmp_path / "buffer.jsonl")
    with pytest.raises(type(error)):
        with RunGuard(t) as runs:
            parent = runs.start_run("parent")
            done = runs.start_run("done", parent=parent)
            runs.end_run(done)
            runs.start_run("cut-short", parent=parent)
            raise error
    statuses = {r.info.run_name: r.info.status for r in MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("exp").experiment_id])}
    assert statuses == {"parent": status, "done": "FINISHED", "cut-short": status}


@pytest.mark.slow
def test_a_tracked_command_on_a_truncated_store_keeps_its_results(tmp_path):
    """`malleable run --simulate` with mlflow.db truncated: it finishes, says what to do, journals its records."""
    state = tmp_path / ".malleable"
    state.mkdir()
    _store(state)  # a real store in the default place, then cut in half
    db = state / "mlflow.db"
    _truncate(db, 0.5)
    # Its own Prefect home: the ephemeral API then migrates a fresh database nobody else is using.
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(tmp_path / "prefect")}
    for name in ("MALLEABLE_TRACKING_URI", "PREFECT_API_URL", "PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-m", "flows.commands.cli", "run", "--simulate", str(REPO / "examples" / "quickstart" / "jobs.yaml")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert f"MLflow store {db.resolve()} is damaged" in proc.stdout + proc.stderr
    journal = state / "mlflow-buffer.jsonl"
    ops = [json.loads(line)["op"] for line in journal.read_text().splitlines()]
    assert ops.count("create_run") == 4 and ops.count("terminate") == 4  # the parent and its 3 jobs
