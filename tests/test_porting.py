"""docs/porting.md's recipe: it loads from its own directory, passes the pre-flight check, is at
most 20 non-blank lines, and trains 2 -> 3 -> 2 GPUs in place exactly as the plain loop does.

The plain loop (examples/porting/plain_loop.py) has named parameter groups with their own LRs,
OneCycleLR (which also cycles AdamW's beta1), a label-smoothed training loss and macro-F1 with
plain cross-entropy every 10 steps. The elastic run records which samples every rank took at
every step; the plain loop replays exactly those batches in one process. Oracles: the plain
loop's own LRs and losses, and a macro-F1 computed here from a confusion matrix over the whole
eval set with the final checkpoint's weights.
"""

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from elastic_tasks.preflight import check_recipe
from elastic_tasks.recipe import load_entry_point

PORTING = Path(__file__).resolve().parents[1] / "examples" / "porting"
LOSS_TOL = 1e-4  # reduction-order noise over 30 AdamW steps is ~1e-7 here (as in test_elastic_system)


@pytest.fixture
def porting_dir(monkeypatch):
    monkeypatch.chdir(PORTING)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(PORTING))])
    for name in ("recipe", "plain_loop"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return PORTING


def test_ported_recipe_loads_from_its_directory_checks_and_is_at_most_20_lines(porting_dir):
    recipe = load_entry_point("recipe:recipe")
    check_recipe(recipe)
    lines = [line for line in (porting_dir / "recipe.py").read_text().splitlines() if line.strip()]
    assert len(lines) <= 20, len(lines)
    assert recipe.loss_fn is None and recipe.eval_every == 10


def _macro_f1(pred: np.ndarray, label: np.ndarray, classes: int) -> float:
    """From the confusion matrix: F1 per class = 2 C[c,c] / (row sum + column sum), averaged."""
    confusion = np.zeros((classes, classes))
    np.add.at(confusion, (label, pred), 1)
    per_class = [2 * confusion[c, c] / max(confusion[c].sum() + confusion[:, c].sum(), 1) for c in range(classes)]
    return float(np.mean(per_class))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ported_script_trains_2_3_2_in_place_like_the_plain_loop(porting_dir, tmp_path, monkeypatch):
    from distributed import Client

    from deploy.local import local_gpu_cluster
    from elastic_tasks.cluster import WorkerPool, warm_up
    from elastic_tasks.coordinator.job import JobCoordinator
    from elastic_tasks.protocol import TrainConfig
    from elastic_tasks.rank.state.elastic import read_checkpoint

    # Spawned Dask workers inherit sys.path: they import recipe and plain_loop from here.
    monkeypatch.syspath_prepend(str(porting_dir))
    import plain_loop

    steps, batch = plain_loop.STEPS, plain_loop.BATCH
    config = TrainConfig(global_batch=batch, max_steps=steps, record_indices=True, timeout_s=60.0, checkpoint_dir=str(tmp_path / "ckpt"))
    with local_gpu_cluster(3) as cluster, Client(cluster) as client:
        warm_up(client, "recipe:recipe")
        job = JobCoordinator(client, WorkerPool(client), f"port-{time.monotonic_ns()}", "recipe:recipe", config, delays={i: 0.05 for i in range(3)})
        job.start(2)
        grow, shrink = job.rescale(3, at_step=8), job.rescale(2, at_step=18)
        result = job.wait(300)
        job.close()
    assert result.finished and 8 <= grow.step < 18 <= shrink.step < steps
    worlds = [h.world_size for h in result.history]
    assert worlds == [2] * grow.step + [3] * (shrink.step - grow.step) + [2] * (steps - shrink.step)

    # The same samples, step by step, through the plain loop in one process.
    taken: dict[int, list[int]] = {}
    for rank in sorted(result.ranks, key=lambda r: r.uid):
        for step, local in rank.indices:
            taken.setdefault(step, []).extend(local)
    assert sorted(taken) == list(range(steps)) and all(len(v) == batch for v in taken.values())
    plain_history, plain_evals, _ = plain_loop.main(batches=[taken[s] for s in range(steps)], steps=steps)

    # Per-group LRs: equal at every step (OneCycle's value per group, ratios kept; batch unchanged).
    for record, (_, plain_lrs) in zip(result.history, plain_history, strict=True):
        assert len(record.group_lrs) == 3
        assert record.group_lrs == pytest.approx(plain_lrs, rel=1e-12), record.step
    assert result.history[0].group_lrs[2] == pytest.approx(3 * result.history[0].group_lrs[0])
    losses = np.array([h.loss for h in result.history])
    plain_losses = np.array([loss for loss, _ in plain_history])
    diff = np.abs(losses - plain_losses).max()
    assert diff < LOSS_TOL, f"max |loss difference| {diff:.3g}"

    # Periodic evaluations at steps 10 and 20, as the plain loop's; the final one at the end.
    assert [e.step for e in result.evals] == [10, 20]
    for got, (plain_step, plain) in zip(result.evals, plain_evals, strict=False):
        assert got.step == plain_step
        assert got.metric("loss") == pytest.approx(plain["loss"], abs=LOSS_TOL)
        assert got.metric("macro_f1") == pytest.approx(plain["macro_f1"], abs=2 / 512)  # one borderline sample at most
    final = dict(result.eval_metrics)

    # The final macro-F1 over the whole eval set, computed here from the checkpoint's weights.
    model = plain_loop.Classifier()
    model.load_state_dict(read_checkpoint(tmp_path / "ckpt")["model"])
    data = plain_loop.eval_set()
    features = torch.stack([data[i]["features"] for i in range(len(data))])
    labels = np.array([data[i]["label"] for i in range(len(data))])
    with torch.no_grad():
        logits = model(features)
    pred = logits.argmax(1).numpy()
    assert final["macro_f1"] == pytest.approx(_macro_f1(pred, labels, plain_loop.CLASSES), abs=1e-12)
    plain_ce = float(-torch.log_softmax(logits, 1)[torch.arange(len(labels)), torch.as_tensor(labels)].mean())
    assert result.eval_loss == pytest.approx(plain_ce, abs=1e-5)  # the eval loss is plain CE, not the smoothed objective
    # Averaging macro-F1 over per-GPU-cap batches would not give the whole-set value here.
    chunks = [_macro_f1(pred[i : i + 16], labels[i : i + 16], plain_loop.CLASSES) for i in range(0, len(labels), 16)]
    assert abs(float(np.mean(chunks)) - final["macro_f1"]) > 1e-3
