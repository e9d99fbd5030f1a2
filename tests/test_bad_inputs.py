"""Every command: bad input -> exit 2, one line naming the file/flag/field and the value, no
traceback, nothing written. In-process through typer's CliRunner for every case, and as a
real subprocess for a few, so that no traceback reaches stderr either."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bad_input_cases import CASES, REPO, describe, make_inputs, run_case, snapshot


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    make_inputs(root)
    return root


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clean_line(case, inputs):
    outcome = run_case(case, inputs)
    assert not outcome.hung, describe(outcome)
    assert outcome.exit_code == case.code, describe(outcome)
    assert len(outcome.lines) == 1, describe(outcome)
    for needle in case.needles:
        assert needle.lower() in outcome.lines[0].lower(), describe(outcome)
    for secret in case.absent:
        assert secret not in "\n".join(outcome.lines), describe(outcome)
    assert not outcome.traceback, describe(outcome)
    assert outcome.written == (), describe(outcome)


def test_the_judge_catches_what_it_should(inputs):
    """A case whose needle is not in the message is not clean: the suite can fail."""
    wrong = CASES[0].__class__("judge", ("plan", "nope.yaml"), ("a word the message lacks",))
    assert not run_case(wrong, inputs).clean
    good = CASES[0].__class__("judge", ("plan", "nope.yaml"), ("nope.yaml",))
    assert run_case(good, inputs).clean


SUBPROCESS = ("train-entry-syntax", "sim-extra-field", "hpo-billing-list", "env-binary-dotenv")


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SUBPROCESS], ids=lambda c: c.id)
def test_no_traceback_reaches_stderr(case, inputs):
    before = snapshot(inputs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(inputs)]), "COLUMNS": "250", "PYTHONDONTWRITEBYTECODE": "1", **dict(case.env)}
    proc = subprocess.run(
        [sys.executable, "-m", "flows.commands.cli", *case.args], cwd=inputs / case.cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == case.code, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert all(n.lower() in lines[0].lower() for n in case.needles), lines
    assert snapshot(inputs) == before


def test_compare_without_runs_creates_no_store(tmp_path, monkeypatch):
    """No recorded runs: exit 1, one line, and no mlflow.db appears."""
    from typer.testing import CliRunner

    from flows.commands.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["compare"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "no MLflow store" in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_compare_with_unreachable_server_fails_fast(tmp_path, monkeypatch):
    """Nothing listens on the port: one line within seconds, not mlflow's minutes of retries."""
    import time

    from typer.testing import CliRunner

    from flows.commands.cli import app
    from tests.ports import unclaimed_port

    port = unclaimed_port()  # nothing listens there, and no port-0 bind is handed it meanwhile
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):  # compare must set them itself
        monkeypatch.setenv(name, "x")  # records the old value, restored after the test
        monkeypatch.delenv(name)
    started = time.monotonic()
    result = CliRunner(env={"COLUMNS": "250", "MALLEABLE_TRACKING_URI": f"http://127.0.0.1:{port}", "MALLEABLE_TRACKING_TIMEOUT_S": "2"}).invoke(app, ["compare"])
    elapsed = time.monotonic() - started
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and "unreachable" in lines[0] and str(port) in lines[0], lines
    assert elapsed < 60, elapsed  # a hang check, not a timing goal: mlflow's default retries take minutes


def _checkpoint(directory: Path, finished: bool) -> None:
    """A real checkpoint of the example MLP, as a rank writes it at the end of a job."""
    import torch

    from elastic_tasks.recipe import load_entry_point
    from elastic_tasks.rank.scaling import LRRamp
    from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta

    recipe = load_entry_point("elastic_tasks.examples:mlp_tiny")
    model = recipe.build_model()
    meta = TrainMeta(step=40, samples_seen=1280, global_batch=32, lr=LRRamp(0.1, 0.1), rng_state=torch.get_rng_state().numpy().tobytes(), finished=finished)
    ElasticState(model, recipe.make_optimizer(model.parameters(), 0.1), meta).save(directory)


def test_train_into_a_finished_checkpoint_dir_says_so_and_starts_nothing(tmp_path):
    import multiprocessing

    from typer.testing import CliRunner

    from flows.commands.cli import app

    _checkpoint(tmp_path / "ckpt", finished=True)
    before = snapshot(tmp_path)
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["train", "elastic_tasks.examples:mlp_tiny", "--checkpoint-dir", str(tmp_path / "ckpt")])
    assert result.exit_code == 0, result.output
    assert "holds a finished run (step 40, 1,280 samples)" in result.output and "nan" not in result.output
    assert not multiprocessing.active_children()
    assert snapshot(tmp_path) == before


def test_train_with_a_damaged_checkpoint_names_it(tmp_path):
    from typer.testing import CliRunner

    from flows.commands.cli import app
    from elastic_tasks.rank.state.elastic import CHECKPOINT_NAME

    _checkpoint(tmp_path / "ckpt", finished=False)
    path = tmp_path / "ckpt" / CHECKPOINT_NAME
    os.truncate(path, path.stat().st_size // 2)
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["train", "elastic_tasks.examples:mlp_tiny", "--checkpoint-dir", str(tmp_path / "ckpt")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "--checkpoint-dir=" in lines[0] and "cannot be read" in lines[0] and "move it aside" in lines[0]


def test_a_user_entry_point_raising_is_one_line_and_v_adds_its_traceback(tmp_path):
    """The user's own bug: one line by default; with -v, the traceback into their file."""
    import subprocess
    import sys

    (tmp_path / "buggy.py").write_text("def recipe():\n    return 1 / 0\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    plain = subprocess.run([sys.executable, "-m", "flows.commands.cli", "train", "buggy:recipe"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    verbose = subprocess.run([sys.executable, "-m", "flows.commands.cli", "-v", "train", "buggy:recipe"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert plain.returncode == verbose.returncode == 2
    lines = [x for x in plain.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "ZeroDivisionError" in lines[0] and "Traceback" not in plain.stderr
    assert "Traceback" in verbose.stderr and f'{tmp_path / "buggy.py"}", line 2' in verbose.stderr
