"""The seven frictions met porting a plain PyTorch loop (issue 24), each pinned by a test.

1. ``loss_fn`` was required beside ``step_fn``.
2. ``step_fn`` got the DDP wrapper in training but the raw model in the check and evaluation.
3. A lambda in a recipe passed the check and failed on the ranks' spawn-started DataLoader workers.
4. ``make_optimizer`` got unnamed parameters; ``set_lr`` overwrote every group's LR (no per-group
   LRs, no OneCycle momentum, no ReduceLROnPlateau).
5. Evaluation only at the end, on the training objective, per-batch-averaged metrics, a second
   forward for metrics, at batch 256 whatever the per-GPU cap.
6. ``malleable train`` printed only the first and last loss.
7. The pre-flight check was CPU-only and could not be skipped.

What ``malleable train`` shows of 6 and 7 is tests/test_porting_frictions_train.py. The
end-to-end port (groups, OneCycle, periodic macro-F1, 2 -> 3 -> 2 in place, a step_fn calling
a method of the model on real ranks) is tests/test_porting.py.
"""

from __future__ import annotations

import math
import time
from functools import partial

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.preflight import RecipeCheckError, check_recipe, preflight_device
from elastic_tasks.protocol import EvalResult
from elastic_tasks.rank import lr as lrs
from elastic_tasks.rank.evaluation.schedule import EvalSchedule
from elastic_tasks.rank.evaluation.evaluate import EVAL_BATCH, EvalLoader, RankEvaluation, evaluate
from elastic_tasks.rank.forward import RecipeStep
from elastic_tasks.rank.data.loader import RankLoader
from elastic_tasks.rank.scaling import LRRamp
from elastic_tasks.rank.data.sharding import EpochSampler
from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta
from elastic_tasks.recipe import LoaderOptions, TrainingRecipe, build_optimizer, optimizer_input
from tests import friction_recipes as fr


def _recipe(**kw) -> TrainingRecipe:
    base = dict(name="t", build_model=fr.Net, dataset=fr.Points(64), step_fn=fr.step, make_optimizer=fr.two_groups, base_lr=0.1, base_batch=8)
    return TrainingRecipe(**{**base, **kw})


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# -- 1 ---------------------------------------------------------------------------------------


def test_1_a_step_fn_recipe_needs_no_loss_fn_and_positional_recipes_still_build():
    recipe = TrainingRecipe(name="r", build_model=fr.Net, dataset=fr.Points(8), step_fn=fr.step, make_optimizer=fr.two_groups, base_lr=0.1, base_batch=4)
    assert recipe.loss_fn is None
    assert TrainingRecipe("p", fr.Net, fr.Points(8), None, fr.two_groups, 0.1, 4, step_fn=fr.step).base_batch == 4
    with pytest.raises(ValueError, match=r"TrainingRecipe\[r\]\.make_optimizer=None: required"):
        TrainingRecipe(name="r", build_model=fr.Net, dataset=fr.Points(8), step_fn=fr.step, base_lr=0.1, base_batch=4)
    with pytest.raises(ValueError, match=r"TrainingRecipe\[r\]\.loss_fn=None: give loss_fn or step_fn"):
        TrainingRecipe(name="r", build_model=fr.Net, dataset=fr.Points(8), make_optimizer=fr.two_groups, base_lr=0.1, base_batch=4)


# -- 2 ---------------------------------------------------------------------------------------


def test_2_step_fn_gets_the_model_build_model_returned_in_check_training_and_evaluation(one_rank_group):
    seen: list[type] = []

    def step_fn(model, batch):
        seen.append(type(model))
        return model.compute_loss(batch)

    recipe = _recipe(step_fn=step_fn, eval_dataset=fr.Points(6, offset=100))
    check_recipe(recipe, torch.device("cpu"))
    model = fr.Net()
    ddp = DistributedDataParallel(RecipeStep(model, recipe))  # what a rank trains through
    batch = recipe.collate([recipe.dataset[i] for i in range(4)])
    loss, _ = ddp(batch)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())  # DDP's hooks saw the step
    evaluate(recipe, model, EvalLoader(recipe, torch.device("cpu"), 3))
    assert seen and set(seen) == {fr.Net}, seen


# -- 3 ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_3_rank_loader_workers_started_by_spawn_never_pickle_the_recipes_other_fields():
    # On Dask workers DataLoader workers start by spawn (what a rank sees): a lambda in
    # lr_schedule or make_scheduler must not travel; only the dataset and collate function do.
    recipe = _recipe(lr_schedule=lambda seen: 1.0, make_scheduler=lambda opt: None, loader=LoaderOptions(num_workers=1))
    check_recipe(recipe, torch.device("cpu"))
    loader = RankLoader(recipe, EpochSampler(64, seed=0))
    loader.loader.multiprocessing_context = "spawn"
    batches = loader.start(0, 8, 2, 1, 1)
    first = next(batches)
    assert len(first["label"]) == 4
    del batches


@pytest.mark.parametrize("field", ["collate_fn", "dataset"])
def test_3_preflight_pickles_what_loader_workers_will_and_names_the_field_and_the_fix(field):
    class LocalRows(fr.Points):  # a class defined in a function: spawn cannot import it
        pass

    kwargs = {"collate_fn": lambda samples: torch.utils.data.default_collate(samples)} if field == "collate_fn" else {"dataset": LocalRows(64)}
    recipe = _recipe(loader=LoaderOptions(num_workers=2), **kwargs)
    with pytest.raises(RecipeCheckError) as info:
        check_recipe(recipe, torch.device("cpu"))
    message = str(info.value)
    assert message.startswith(f"TrainingRecipe[t].{field}: cannot be pickled") and "\n" not in message
    assert "define it at module level" in message and "num_workers=0" in message
    check_recipe(_recipe(loader=LoaderOptions(num_workers=0), **kwargs), torch.device("cpu"))  # nothing pickled without workers


# -- 4 ---------------------------------------------------------------------------------------


def test_4_make_optimizer_is_given_what_its_first_parameter_names():
    def by_model(model, lr):
        return torch.optim.SGD([{"params": model.hidden.parameters()}, {"params": model.head.parameters(), "lr": lr * 2}], lr=lr)

    def by_params(params, lr):
        return torch.optim.SGD(params, lr=lr)

    assert [optimizer_input(f) for f in (fr.two_groups, by_model, by_params, partial(torch.optim.SGD), torch.optim.AdamW)] == [
        "named_parameters", "model", "parameters", "parameters", "parameters"
    ]
    model = fr.Net()
    named = build_optimizer(_recipe(), model)
    assert [len(g["params"]) for g in named.param_groups] == [2, 2] and named.param_groups[0]["params"][0] is model.hidden.weight
    assert [g["lr"] for g in build_optimizer(_recipe(make_optimizer=by_model), model).param_groups] == [0.1, 0.2]
    assert len(build_optimizer(_recipe(make_optimizer=by_params), model).param_groups) == 1


def _onecycle(opt):
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[g["lr"] for g in opt.param_groups], total_steps=12)


@pytest.mark.parametrize("make_scheduler", [_onecycle, fr.plateau], ids=["onecycle", "plateau"])
def test_4_lr_factor_multiplies_each_groups_own_lr_and_never_compounds_a_scheduler(make_scheduler):
    # The elastic optimizer steps under a factor of 2 (global batch twice the base); the plain
    # one is the same optimizer and scheduler, unscaled. At every step the LR applied must be
    # exactly twice the plain one's, group by group, and beta1 (OneCycle) the same.
    torch.manual_seed(0)
    plain_model, elastic_model = fr.Net(), fr.Net()
    elastic_model.load_state_dict(plain_model.state_dict())
    plain = torch.optim.AdamW([{"params": plain_model.hidden.parameters()}, {"params": plain_model.head.parameters(), "lr": 0.004}], lr=0.01)
    elastic = torch.optim.AdamW([{"params": elastic_model.hidden.parameters()}, {"params": elastic_model.head.parameters(), "lr": 0.004}], lr=0.01)
    plain_sched, elastic_sched = make_scheduler(plain), make_scheduler(elastic)
    recipe = _recipe(base_lr=0.01)
    factor = lrs.lr_factor(recipe, 0.02, samples_seen=0)
    assert factor == pytest.approx(2.0)
    for step in range(12):
        expected = [2 * g["lr"] for g in plain.param_groups]
        betas = [g["betas"] for g in plain.param_groups]
        elastic_model.zero_grad()
        elastic_model.compute_loss({"x": torch.ones(1, 8), "label": torch.tensor([1])}).backward()
        with lrs.scaled_lrs(elastic, factor) as applied:
            assert [g["betas"] for g in elastic.param_groups] == betas
            elastic.step()
        assert list(applied) == pytest.approx(expected, rel=1e-12), step
        plain.step()  # no gradients: only the schedule moves
        lrs.after_step(elastic_sched)
        if isinstance(plain_sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            plain_sched.step(1.0)
            lrs.after_evaluation(_recipe(scheduler_metric="m"), elastic_sched, {"m": 1.0})
        else:
            plain_sched.step()
    assert [g["lr"] for g in elastic.param_groups] == pytest.approx([g["lr"] for g in plain.param_groups], rel=1e-12)
    with pytest.raises(lrs.SchedulerMetricError, match=r"scheduler_metric='loss': the evaluation returned \['acc'\]"):
        lrs.after_evaluation(_recipe(), fr.plateau(elastic), {"acc": 1.0})


def test_4_the_schedulers_state_travels_in_a_checkpoint(tmp_path):
    def build():
        model = fr.Net()
        opt = fr.two_groups(model.named_parameters(), 0.1)
        return model, opt, _onecycle(opt)

    model, opt, sched = build()
    for _ in range(5):
        opt.step()
        sched.step()
    meta = TrainMeta(step=5, samples_seen=40, global_batch=8, lr=LRRamp(0.1, 0.1), rng_state=b"")
    ElasticState(model, opt, meta, scheduler=sched).save(tmp_path)
    model2, opt2, sched2 = build()
    ElasticState(model2, opt2, meta, scheduler=sched2).load(tmp_path)
    for _ in range(3):  # both continue the same cycle
        opt.step(), sched.step(), opt2.step(), sched2.step()
        assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]
        assert [g["momentum"] for g in opt2.param_groups] == [g["momentum"] for g in opt.param_groups]
    assert sched2.last_epoch == 8


# -- 5 ---------------------------------------------------------------------------------------


class _Counting(fr.Net):
    forwards = 0
    batch_sizes: list[int] = []

    def forward(self, x):
        type(self).forwards += 1
        type(self).batch_sizes.append(len(x))
        return super().forward(x)


@pytest.mark.parametrize("cap", [None, 8])
def test_5_evaluation_reads_one_forward_per_batch_at_the_per_gpu_cap(cap):
    # Issue 22 item 3: evaluation used batch 256 whatever the job's max_batch_per_gpu.
    recipe = _recipe(eval_dataset=fr.Points(300, offset=7), eval_fn=fr.rank0_eval, eval_every=3)
    model = _Counting()
    _Counting.forwards, _Counting.batch_sizes = 0, []
    meta = TrainMeta(step=6, samples_seen=48, global_batch=512, lr=LRRamp(0.1, 0.1), rng_state=b"")
    result = RankEvaluation(recipe, cap, torch.device("cpu")).run(ElasticState(model, build_optimizer(recipe, model), meta), rank=0, world=1)
    largest = cap if cap is not None else EVAL_BATCH  # no cap: one rank's share (512), at most 256
    assert max(_Counting.batch_sizes) == largest and sum(_Counting.batch_sizes) == 300
    assert _Counting.forwards == math.ceil(300 / largest)  # one forward per batch: eval_fn's own
    # Oracle: the metrics over the whole set, computed here in one batch.
    data = [recipe.eval_dataset[i] for i in range(300)]
    with torch.no_grad():
        logits = fr.Net.forward(model, torch.stack([d["x"] for d in data]))
    labels = torch.tensor([d["label"] for d in data])
    assert result.step == 6 and result.loss == pytest.approx(float(F.cross_entropy(logits, labels)), abs=1e-6)
    assert result.metric("accuracy") == pytest.approx(float((logits.argmax(1) == labels).float().mean()))
    # Without eval_fn (the training objective) the same cap holds.
    _Counting.batch_sizes = []
    plain = _recipe(eval_dataset=fr.Points(300, offset=7))
    RankEvaluation(plain, cap, torch.device("cpu")).run(ElasticState(model, build_optimizer(plain, model), meta), rank=0, world=1)
    assert max(_Counting.batch_sizes) == largest and sum(_Counting.batch_sizes) == 300


def test_5_eval_schedule_by_steps_and_by_rank0_clock_skips_clocks_read_before_the_last_evaluation():
    by_steps = EvalSchedule(every_steps=5, every_s=None)
    assert [s for s in range(1, 16) if by_steps.due(s)] == [5, 10, 15]
    by_steps.evaluated(10)
    assert not by_steps.due(10)
    by_time = EvalSchedule(every_steps=None, every_s=2.0)
    assert not by_time.due(3, agreed_step=1, agreed_clock=1.9)
    assert by_time.due(4, agreed_step=2, agreed_clock=2.1)
    by_time.evaluated(4)
    # The agreement of step 3 was issued before that evaluation: its clock is stale.
    assert not by_time.due(5, agreed_step=3, agreed_clock=2.5)
    assert by_time.due(6, agreed_step=4, agreed_clock=2.5)
    with pytest.raises(ValueError, match=r"eval_every=0: must be a number of steps >= 1"):
        _recipe(eval_dataset=fr.Points(4), eval_every=0)
    with pytest.raises(ValueError, match=r"eval_fn: needs eval_dataset"):
        _recipe(eval_fn=fr.rank0_eval)


def _own_plateau(metrics: list[float], lr: float, factor: float = 0.5) -> list[float]:
    """ReduceLROnPlateau(mode=min, patience=0, threshold=0) by hand: the LR after each evaluation."""
    best, out = math.inf, []
    for m in metrics:
        if m < best:
            best = m
        else:
            lr *= factor
        out.append(lr)
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_5_sharded_evaluation_by_seconds_feeds_reduce_on_plateau_on_real_ranks(tmp_path):
    # Two gloo ranks on Dask; evaluation every 0.4 s of rank 0's clock, sharded: if the ranks
    # disagreed on when, the gather would hang. Macro-F1 over the whole eval set is checked
    # against a confusion matrix computed here from the final checkpoint.
    from distributed import Client

    from deploy.local import local_gpu_cluster
    from elastic_tasks.cluster import WorkerPool, warm_up
    from elastic_tasks.coordinator.job import JobCoordinator
    from elastic_tasks.protocol import TrainConfig
    from elastic_tasks.rank.state.elastic import read_checkpoint

    entry = "tests.friction_recipes:plateau_recipe"
    config = TrainConfig(global_batch=16, max_steps=40, max_batch_per_gpu=fr.EVAL_CAP, timeout_s=60.0, checkpoint_dir=str(tmp_path))
    with local_gpu_cluster(2) as cluster, Client(cluster) as client:
        warm_up(client, entry)
        job = JobCoordinator(client, WorkerPool(client), f"plateau-{time.monotonic_ns()}", entry, config, delays={0: 0.05, 1: 0.05})
        job.start(2)
        result = job.wait(240)
        job.close()
    assert result.finished and len(result.evals) >= 2, result.evals
    steps = [e.step for e in result.evals]
    assert steps == sorted(set(steps)) and all(0 < s < 40 for s in steps)
    for ev in (*result.evals, EvalResult(result.eval_loss, None, 203, result.eval_metrics, 40)):
        assert ev.metric("samples") == 203 and ev.metric("world") == 2  # the whole set, from both ranks
        assert ev.metric("largest_batch") == fr.EVAL_CAP  # the job's per-GPU cap, not 256
    # LR per group: base (0.2, 0.05), halved by the scheduler after each non-improving evaluation.
    after = _own_plateau([e.metric("largest_batch") for e in result.evals], 1.0)
    for record in result.history:
        done = [i for i, e in enumerate(result.evals) if e.step <= record.step]
        scale = after[done[-1]] if done else 1.0
        assert record.group_lrs == pytest.approx((0.2 * scale, 0.05 * scale), rel=1e-12), record.step
    assert result.history[-1].group_lrs[0] < 0.2
    # Final macro-F1 over the whole eval set, from the checkpoint's weights.
    model = fr.Net()
    model.load_state_dict(read_checkpoint(tmp_path)["model"])
    data = fr.Points(203, offset=50_000)
    with torch.no_grad():
        pred = model(torch.stack([data[i]["x"] for i in range(203)])).argmax(1).numpy()
    label = np.array([data[i]["label"] for i in range(203)])
    confusion = np.zeros((3, 3))
    np.add.at(confusion, (label, pred), 1)
    f1 = np.mean([2 * confusion[c, c] / max(confusion[c].sum() + confusion[:, c].sum(), 1) for c in range(3)])
    assert dict(result.eval_metrics)["macro_f1"] == pytest.approx(f1, abs=1e-12)


# -- 6 and 7 ---------------------------------------------------------------------------------


def test_7_preflight_runs_on_the_device_the_ranks_will_use(monkeypatch):
    assert preflight_device() == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert preflight_device() == torch.device("cuda", 0)
    where: list[tuple[torch.device, torch.device]] = []

    def step_fn(model, batch):
        where.append((next(model.parameters()).device, batch["x"].device))
        return model.compute_loss(batch)

    check_recipe(_recipe(step_fn=step_fn), torch.device("cpu"))
    assert where == [(torch.device("cpu"), torch.device("cpu"))]
