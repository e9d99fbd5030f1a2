"""`malleable profile` through the real CLI: table, JSON file, cache, and one-line bad-input errors."""

import json

import pytest
from typer.testing import CliRunner

from allocator.profiles.io import profile_from_dict
from flows.commands.cli import app

runner = CliRunner(env={"COLUMNS": "200"})
FAST = ["--batches", "4,8", "--repeats", "1", "--warmup", "0", "--gpus-for-allreduce", "1", "--threads", "1"]


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path, monkeypatch):
    """`malleable profile` keeps what it measures in <state dir>/profiles: a test's own, so no
    other test finds it there (`submit` would plan with it instead of a prior)."""
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))


def test_profile_prints_table_and_writes_json(tmp_path):
    out = tmp_path / "p" / "mlp.json"
    result = runner.invoke(app, ["profile", "elastic_tasks.examples:mlp_tiny", *FAST, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "samples/s" in result.output and "mlp_tiny" in result.output
    prof = profile_from_dict(json.loads(out.read_text()))
    assert prof.workload == "mlp_tiny" and prof.batch_sizes == (4, 8) and prof.max_batch_per_gpu == 8


def test_profile_cache_dir_reuses_the_profile(tmp_path):
    args = ["profile", "elastic_tasks.examples:mlp_tiny", *FAST, "--cache-dir", str(tmp_path)]
    first = runner.invoke(app, args)
    assert first.exit_code == 0 and "(measured)" in first.output, first.output
    second = runner.invoke(app, args)
    assert second.exit_code == 0 and "(cached)" in second.output, second.output
    assert len(list(tmp_path.glob("mlp_tiny-*.json"))) == 1


@pytest.mark.parametrize(
    "args,message",
    [
        (["not_an_entry_point"], "expected 'package.module:function'"),
        (["no_such_pkg.mod:fn"], "cannot import module"),
        (["elastic_tasks.examples:missing"], "no callable 'missing'"),
        (["elastic_tasks.examples:mlp_tiny", "--batches", "8,x"], "--batches='8,x'"),
        (["elastic_tasks.examples:mlp_tiny", "--batches", "0,8"], "batch_sizes"),
        (["elastic_tasks.examples:mlp_tiny", "--max-batch", "2", "--batches", "4,8", "--gpus-for-allreduce", "1"], "none fits max_batch_per_gpu=2"),
        (["elastic_tasks.examples:mlp_tiny", "--device", "tpu"], "device"),
        (["elastic_tasks.examples:mlp_tiny", "--threads", "0"], "threads=0"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message):
    result = runner.invoke(app, ["profile", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
