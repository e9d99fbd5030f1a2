"""``malleable train``: bad input fails in one line before any process exists; a real run rescales."""

import multiprocessing

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.cmd_train import parse_rescales

runner = CliRunner()
ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["no_such_pkg.mod:fn"], "cannot import module"),
        (["elastic_tasks.examples.recipes"], "expected 'package.module:function'"),
        ([ENTRY, "--gpus", "3", "--batch", "2"], "--batch=2"),
        ([ENTRY, "--rescale-at", "5"], "--rescale-at='5'"),
        ([ENTRY, "--steps", "10", "--rescale-at", "20:2"], "0 < STEP < --steps=10"),
        ([ENTRY, "--rescale-at", "5:2", "--rescale-at", "3:1"], "steps must increase"),
        ([ENTRY, "--gpus", "3", "--workers", "2"], "--workers=2"),
        ([ENTRY, "--restart"], "--restart: needs --checkpoint-dir"),
    ],
)
def test_bad_input_one_line_exit_2_no_processes(args, needle):
    result = runner.invoke(app, ["train", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output
    assert not multiprocessing.active_children()


def test_parse_rescales():
    assert parse_rescales(["10:3", "20:1"], 30) == [(10, 3), (20, 1)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_runs_with_forced_rescales():
    result = runner.invoke(app, ["train", ENTRY, "--gpus", "2", "--steps", "300", "--batch", "48", "--rescale-at", "100:3", "--rescale-at", "200:1"])
    assert result.exit_code == 0, result.output
    assert "2 -> 3" in result.output and "3 -> 1" in result.output
    assert "steps 300" in result.output and "eval accuracy" in result.output
