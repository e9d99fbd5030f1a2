"""Issue 35.5: MLflow's own variables honoured, the project's settings as the fallback; a new
experiment's artifact root chosen explicitly, never ./mlruns of wherever a command ran."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from flows.config.settings import SettingsError, load_settings
from service.tracking.experiment import artifact_root

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("MLFLOW_TRACKING_URI", "MALLEABLE_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MALLEABLE_EXPERIMENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    return monkeypatch


def test_mlflow_variables_first_the_projects_as_fallback_a_flag_over_both(clean_env):
    clean_env.setenv("MALLEABLE_TRACKING_URI", "sqlite:///project.db")
    clean_env.setenv("MALLEABLE_EXPERIMENT", "project")
    assert (load_settings().tracking_uri, load_settings().experiment) == ("sqlite:///project.db", "project")
    clean_env.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    clean_env.setenv("MLFLOW_EXPERIMENT_NAME", "theirs")
    assert (load_settings().tracking_uri, load_settings().experiment) == ("sqlite:///mlflow.db", "theirs")
    assert load_settings(tracking_uri="sqlite:///flag.db", experiment="flag").tracking_uri == "sqlite:///flag.db"
    assert load_settings(experiment="flag").experiment == "flag"


@pytest.mark.parametrize("name", ["MLFLOW_TRACKING_URI", "MALLEABLE_TRACKING_URI"])
def test_a_bad_uri_is_named_by_the_variable_it_came_from(clean_env, name):
    clean_env.setenv(name, "not a uri")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert str(info.value).startswith(f"{name}='not a uri': ")


def test_artifact_root_beside_a_sqlite_store_the_servers_own_else_the_state_dir(tmp_path):
    assert artifact_root(f"sqlite:///{tmp_path}/a/x.db", tmp_path / "state") == (tmp_path / "a" / "mlartifacts").as_uri()
    assert artifact_root("http://mlflow:5000", tmp_path) is None and artifact_root("databricks", tmp_path) is None
    assert artifact_root("postgresql+psycopg://u@db/x", tmp_path / "state") == (tmp_path / "state" / "mlartifacts").as_uri()


@pytest.mark.slow
def test_run_simulate_writes_to_the_mlflow_tracking_uri(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLEABLE_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI="sqlite:///x.db", PREFECT_HOME=str(tmp_path / "prefect"))
    done = subprocess.run(
        [sys.executable, "-m", "flows.commands.cli", "run", str(REPO / "examples" / "quickstart" / "jobs.yaml"), "--simulate"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with sqlite3.connect(tmp_path / "x.db") as db:
        experiments = dict(db.execute("SELECT name, artifact_location FROM experiments").fetchall())
        runs = db.execute("SELECT COUNT(*) FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id WHERE e.name = 'malleable'").fetchone()[0]
    assert experiments["malleable"] == (tmp_path / "mlartifacts").as_uri() and runs >= 1
    assert not (tmp_path / ".malleable" / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()


def test_a_run_cut_short_by_an_error_is_failed_with_the_error(tmp_path):
    from mlflow import MlflowClient

    from flows.recording.run_guard import RunGuard
    from flows.recording.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "guarded", tmp_path / "buffer.jsonl", artifact_location=artifact_root(uri, tmp_path))
    with pytest.raises(ValueError, match="bad step"), RunGuard(tracker) as guard:
        run = guard.start_run("r")
        raise ValueError("bad step 7")
    tracker.flush()
    got = MlflowClient(uri).get_run(tracker.run_id(run))
    assert got.info.status == "FAILED" and got.data.tags["malleable.error"] == "ValueError: bad step 7"
