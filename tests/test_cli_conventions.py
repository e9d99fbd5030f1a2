"""Issue 35.8: CLI conventions. `python -m malleable`; `wait` tells a timeout (3) from a failed job
(1); `jobs` shows who submitted; piped tables are not cut to 80 columns; the service's log lines
carry the date (tests/test_fresh_code.py, on a real service). Real sqlite stores and real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from flows.commands.cli import app
from service.client import ServiceClient
from tests.service_helpers import job_entry

REPO = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLEABLE_", "COLUMNS"))}
    env.update(PYTHONPATH=str(REPO), MALLEABLE_JOB_STORE=f"sqlite:///{tmp_path / 'jobs.db'}", MALLEABLE_STATE_DIR=str(tmp_path / "state"))
    return env


def test_python_dash_m_malleable_is_the_cli(tmp_path):
    done = subprocess.run([sys.executable, "-m", "malleable", "--help"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "serve" in done.stdout and "submit" in done.stdout


def test_wait_exits_3_on_timeout_and_1_on_a_job_that_did_not_finish(tmp_path):
    env = _env(tmp_path)
    client = ServiceClient(env["MALLEABLE_JOB_STORE"], submitter="alice")
    queued, cancelled = client.submit(job_entry("q")).job_id, client.submit(job_entry("c")).job_id
    client.cancel(cancelled)
    run = CliRunner(env={"MALLEABLE_JOB_STORE": env["MALLEABLE_JOB_STORE"], "MALLEABLE_STATE_DIR": env["MALLEABLE_STATE_DIR"]})
    assert run.invoke(app, ["wait", queued, "--timeout", "0.5"]).exit_code == 3
    assert run.invoke(app, ["wait", cancelled]).exit_code == 1


def test_piped_tables_are_whole_and_show_the_submitter(tmp_path):
    env = _env(tmp_path)
    long_name = "a-rather-long-job-name-x"  # 24 characters: the column's bound
    ServiceClient(env["MALLEABLE_JOB_STORE"], submitter="alice (alice@laptop)").submit(job_entry(long_name))
    listed = subprocess.run([sys.executable, "-m", "malleable", "jobs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    header, row = listed.stdout.splitlines()[:2]
    assert header.split() == ["id", "name", "submitter", "state", "gpus", "batch", "progress", "eta"]
    assert long_name in row and "alice (alice@laptop)" in row and "…" not in row
    simulated = subprocess.run(
        [sys.executable, "-m", "malleable", "simulate", str(REPO / "examples" / "quickstart" / "jobs.yaml"), "-p", "goodput_dp", "-p", "elastic_dp", "--out", str(tmp_path / "sim")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert simulated.returncode == 0, simulated.stderr
    rows = [line for line in simulated.stdout.splitlines() if line.startswith("│")]
    assert {line.split("│")[1].strip() for line in rows} >= {"goodput_dp", "elastic_dp"}, simulated.stdout


def test_shell_completion_completes_commands_and_options(tmp_path):
    script = tmp_path / "malleable"  # the console script's name: completion reads _MALLEABLE_COMPLETE
    script.write_text("from flows.commands.cli import main\nmain()\n")
    env = _env(tmp_path)

    def complete(words: str) -> list[str]:
        extra = {"_MALLEABLE_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=60)
        return done.stdout.split()

    assert complete("malleable su") == ["submit"]
    assert "--timeout" in complete("malleable wait --t")
    shown = subprocess.run([sys.executable, str(script), "--show-completion", "bash"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "_MALLEABLE_COMPLETE" in shown.stdout
