"""Frictions 6 and 7 met porting a plain PyTorch loop (issue 24), as ``malleable train`` meets them.

6. ``malleable train`` printed only the first and last loss: now a live line per step, each
   evaluation once, and the loss and LR curves at the end.
7. The pre-flight check was CPU-only and could not be skipped: on a GPU host it runs in a child
   process whose error comes back whole, fails in one line, and ``--no-preflight`` skips it.

Frictions 1-5 and the check's device are tests/test_porting_frictions.py.
"""

from __future__ import annotations

import math
import multiprocessing

import pytest
import torch
from typer.testing import CliRunner

from elastic_tasks.preflight import RecipeCheckError, check_entry_point
from elastic_tasks.protocol import EvalResult
from tests import friction_recipes as fr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_7_on_a_gpu_the_check_runs_in_a_child_process_and_its_error_comes_back_whole():
    # What a GPU host does (isolate=None and a CUDA device): forced here on the CPU.
    with pytest.raises(RecipeCheckError) as info:
        check_entry_point("tests.friction_recipes:vector_loss_recipe", fr.vector_loss_recipe(), torch.device("cpu"), isolate=True)
    assert str(info.value).startswith("TrainingRecipe[vector].step_fn: returned Tensor of shape (2,)")
    check_entry_point("tests.friction_recipes:plateau_recipe", fr.plateau_recipe(), torch.device("cpu"), isolate=True)


def test_7_a_recipe_that_builds_only_on_the_workers_fails_the_check_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    result = CliRunner().invoke(_app(), ["train", "tests.friction_recipes:worker_only_recipe", "--steps", "4"])
    assert result.exit_code == 2, result.output
    assert "TrainingRecipe[worker-only].build_model: RuntimeError: builds only on the workers" in result.output
    assert "Traceback" not in result.output and not multiprocessing.active_children()


def _app():
    from flows.commands.cli import app

    return app


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_6_7_train_skips_the_check_when_told_shows_each_step_and_ends_with_the_curve(monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    history_csv = tmp_path / "out" / "history.csv"
    args = ["train", "tests.friction_recipes:worker_only_recipe", "--gpus", "2", "--steps", "12", "--rescale-at", "6:1", "--no-preflight", "--history", str(history_csv)]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "pre-flight check skipped (--no-preflight" in out
    assert "step " in out and " · loss " in out and " · lr " in out and "GPU × 8" in out  # the live line, printed off a terminal
    assert "eval at step 4: loss" in out and "eval at step 8: loss" in out
    assert "loss ▁" in out or any(line.startswith("loss ") and any(c in line for c in "▁▂▃▄▅▆▇█") for line in out.splitlines())
    assert any(line.startswith("lr   ") for line in out.splitlines())
    rows = history_csv.read_text().splitlines()
    assert rows[0].startswith("step,loss,lr_group_0,lr_group_1,gpus,global_batch") and len(rows) == 13
    assert [r.split(",")[4] for r in rows[1:]] == ["2"] * 6 + ["1"] * 6
    client = MlflowClient(f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == list(range(12))
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "eval_loss")) == [4, 8]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "figures")] == ["figures/step_curve.png"]


def test_6_live_line_shows_step_loss_lr_rate_gpus_batch_and_each_evaluation_once():
    import io

    from rich.console import Console

    from elastic_tasks.board import JobStatus
    from flows.commands.shared.live import StepProgress

    out, logged = io.StringIO(), []
    progress = StepProgress(Console(file=out, width=200), 30, lambda: None, on_eval=logged.append, print_every_s=0.0)
    ev = EvalResult(0.5, None, 100, (("macro_f1", 0.75),), 10)
    statuses = [
        JobStatus(0, 9, 288, 2, 32, 1.25, 100.0, lr=0.01),
        JobStatus(0, 11, 352, 3, 32, 1.0, 100.5, lr=0.005, recent_evals=(ev,)),  # 64 samples in 0.5 s
        JobStatus(1, 12, 384, 3, 32, 0.9, 100.75, lr=0.004, recent_evals=(ev,)),
    ]
    for status in statuses:
        progress.show(status)
    lines = out.getvalue().splitlines()
    assert lines[0] == "step 9/30 · loss 1.2500 · lr 0.01 · 2 GPU × 32"
    assert lines[1] == "step 11/30 · loss 1.0000 · lr 0.005 · 128 samples/s · 3 GPU × 32"
    assert lines[2] == "eval at step 10: loss 0.5, macro_f1 0.75" and lines.count(lines[2]) == 1
    assert lines[3] == "step 12/30 · loss 0.9000 · lr 0.004 · 128 samples/s · 3 GPU × 32" and logged == [ev]


def test_6_sparkline_orders_values_by_height():
    from flows.recording.step_curve import sparkline

    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5.0] * 3) == "▁▁▁" and sparkline([]) == "" and len(sparkline(list(range(100)), width=10)) == 10
    assert sparkline([1.0, math.nan, 3.0]) == "▁ █"

