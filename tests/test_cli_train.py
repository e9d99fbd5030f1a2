"""``malleable train``: bad input fails in one line before any process exists; a real run rescales."""

import multiprocessing

import pytest
from typer.testing import CliRunner

from flows.commands.cli import app
from flows.commands.train import declared_switches, parse_rescales

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


def test_declared_switches_are_the_steps_that_publish_a_plan():
    # In place, a step that asks for the GPUs the job already has publishes nothing (the batch
    # stays): holding the ranks there would stall them until the data-plane timeout.
    schedule = [(5, 2), (10, 3), (15, 3), (20, 1)]
    assert declared_switches(schedule, 2, restart=False) == {10, 20}
    # The restart path stops and restarts at every declared step, the same count included.
    assert declared_switches(schedule, 2, restart=True) == {5, 10, 15, 20}
    assert declared_switches([], 4, restart=False) == frozenset()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_runs_with_forced_rescales():
    result = runner.invoke(app, ["train", ENTRY, "--gpus", "2", "--steps", "300", "--batch", "48", "--rescale-at", "100:3", "--rescale-at", "200:1"])
    assert result.exit_code == 0, result.output
    assert "2 -> 3" in result.output and "3 -> 1" in result.output
    assert "steps 300" in result.output and "eval accuracy" in result.output


DICT_RECIPE = '''
import torch
from functools import partial
from torch import nn
from elastic_tasks.recipe import TrainingRecipe


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, generator=g)
        return {"features": x, "target": x.sum(dim=0, keepdim=True)}


def mse(model, batch):
    return (model(batch["features"]) - batch["target"]).pow(2).mean()


def sgd(params, lr):
    return torch.optim.SGD(params, lr=lr)


def recipe():
    return TrainingRecipe("rows", partial(nn.Linear, 4, 1), Rows(), None, sgd, 0.05, 8, step_fn=mse)


def broken():  # dict samples under the (x, y) contract: caught before any worker starts
    return TrainingRecipe("broken", partial(nn.Linear, 4, 1), Rows(), torch.nn.functional.mse_loss, sgd, 0.05, 8)
'''


def test_recipe_mismatch_is_one_line_naming_the_field_before_any_process(tmp_path, monkeypatch):
    import sys

    (tmp_path / "cwd_dict_recipe.py").write_text(DICT_RECIPE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_dict_recipe", raising=False)
    result = runner.invoke(app, ["train", "cwd_dict_recipe:broken"])
    assert result.exit_code == 2, result.output
    assert "TrainingRecipe[broken].dataset[0]: a dict sample" in result.output
    assert "Traceback" not in result.output and not multiprocessing.active_children()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_recipe_module_in_the_current_directory_trains_without_pythonpath(tmp_path):
    # A user's own module next to them, dict batches, `malleable train mod:fn`: as with
    # `python -m`, the current directory is searched. PYTHONPATH names only this checkout.
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "myrecipe.py").write_text(DICT_RECIPE)
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": repo}
    malleable = Path(sys.executable).with_name("malleable")
    out = subprocess.run(
        [str(malleable), "train", "myrecipe:recipe", "--gpus", "1", "--steps", "6", "--workers", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "steps 6" in out.stdout and "rows: generations" in out.stdout
    # Quiet to the end: the cluster's close used to log a rank's cancelled plan wait as an ERROR.
    assert "Traceback" not in out.stdout + out.stderr and " ERROR " not in out.stdout + out.stderr, out.stderr[-2000:]
