"""The wider training contract, in one process: loader, step hook, precision, clipping, preflight, entry points."""

from __future__ import annotations

import math
import sys
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from elastic_tasks.rank import lr as lrs
from elastic_tasks.rank import step as steps
from elastic_tasks.examples import tiny_lm
from elastic_tasks.rank.data.loader import RankLoader, rank_loader
from elastic_tasks.preflight import RecipeCheckError, check_recipe
from elastic_tasks.recipe import EntryPointError, LoaderOptions, TrainingRecipe, load_entry_point, to_device
from elastic_tasks.rank.scaling import LRRamp, accumulation_steps, micro_batches
from elastic_tasks.rank.data.sharding import EpochSampler, rank_slice
from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta, buckets


class Indexed(Dataset):
    """Sample i is a dict holding i: what a loader delivered is countable."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"index": torch.tensor(i), "x": torch.full((3,), float(i))}


def _index_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(batch["x"]).pow(2).mean()


def _recipe(dataset: Dataset, **kw) -> TrainingRecipe:
    base = dict(
        name="t", build_model=partial(nn.Linear, 3, 1), dataset=dataset, loss_fn=None, make_optimizer=partial(torch.optim.SGD),
        base_lr=0.1, base_batch=8, step_fn=_index_loss,
    )
    return TrainingRecipe(**{**base, **kw})


@pytest.mark.parametrize("options", [LoaderOptions(), LoaderOptions(num_workers=2, pin_memory=False, prefetch_factor=3)])
def test_rank_loaders_across_mid_epoch_rescales_neither_repeat_nor_skip_a_sample(options):
    # 2 ranks for 7 steps, 3 ranks (memory cap -> accumulation) for 5, then 1 rank for 9: the
    # switches fall mid-epoch. Each rank keeps its loader (and its worker processes) across
    # generations, as a surviving rank does; what it prefetched for the old share is discarded.
    n, batch = 97, 10
    recipe = _recipe(Indexed(n), loader=options)
    sampler = EpochSampler(n, seed=4)
    loaders: dict[int, RankLoader] = {}
    delivered: list[int] = []
    seen = 0
    for world, n_steps, cap in [(2, 7, None), (3, 5, 2), (1, 9, None)]:
        accum = accumulation_steps(batch, world, cap)
        iters = [loaders.setdefault(r, RankLoader(recipe, sampler)).start(seen, batch, world, r, accum) for r in range(world)]
        for _ in range(n_steps):
            for r in range(world):
                lo, hi = rank_slice(batch, world, r)
                for _chunk in micro_batches(hi - lo, accum):
                    micro = next(iters[r])
                    assert cap is None or len(micro["index"]) <= cap
                    delivered.extend(micro["index"].tolist())
            seen += batch
        del iters
    # Oracle by counting: 210 samples = two full epochs of 97 and 16 more, all distinct in each epoch.
    assert len(delivered) == 21 * batch
    assert sorted(delivered[:n]) == list(range(n)) and sorted(delivered[n : 2 * n]) == list(range(n))
    assert len(set(delivered[2 * n :])) == len(delivered) - 2 * n
    # A one-off iterator (scripts) reads the same stream.
    first = next(rank_loader(recipe, sampler, 0, batch, 2, 0, 1))
    assert first["index"].tolist() == delivered[:5]


@pytest.mark.parametrize(
    ("sample", "step_fn"),
    [
        ({"a": torch.ones(3), "b": torch.ones(1)}, lambda m, b: (m(b["a"]) - b["b"]).pow(2).mean()),
        ((torch.ones(3), (torch.ones(1), torch.zeros(1))), lambda m, b: (m(b[0]) - b[1][0]).pow(2).mean()),
        (torch.ones(3), lambda m, b: m(b).pow(2).mean()),
    ],
    ids=["dict", "nested-tuple", "tensor"],
)
def test_step_hook_takes_any_batch_structure_and_preflight_passes(sample, step_fn):
    class Same(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return sample

    recipe = _recipe(Same(), step_fn=step_fn)
    check_recipe(recipe)
    batch = to_device(recipe.collate([sample, sample]), torch.device("cpu"))
    loss, correct = recipe.loss(nn.Linear(3, 1), batch)
    assert loss.dim() == 0 and correct is None


class Pairs(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.ones(3), torch.tensor(i % 2)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"dataset": Indexed(4), "step_fn": None, "loss_fn": F.cross_entropy}, "dataset[0]: a dict sample"),
        ({"dataset": Pairs(), "step_fn": None, "loss_fn": F.cross_entropy, "build_model": partial(nn.Linear, 4, 2)}, ".loss_fn: RuntimeError"),
        ({"step_fn": lambda m, b: b["missing"]}, ".step_fn: KeyError: 'missing'"),
        ({"step_fn": lambda m, b: m(b["x"])}, ".step_fn: returned Tensor of shape (2, 1), expected a scalar loss"),
        ({"collate_fn": lambda s: 1 / 0}, ".collate_fn: ZeroDivisionError"),
        ({"eval_dataset": Indexed(2), "eval_metrics": lambda m, b: {"x": "high"}}, ".eval_metrics: 'x' -> 'high' is not str -> number"),
    ],
)
def test_preflight_names_the_field_in_one_line(kwargs, needle):
    with pytest.raises(RecipeCheckError) as info:
        check_recipe(_recipe(kwargs.pop("dataset", Indexed(4)), **kwargs))
    message = str(info.value)
    assert needle in message and "\n" not in message and message.startswith("TrainingRecipe[t].")


def test_recipe_rejects_bad_fields():
    for kwargs, needle in [
        ({"precision": "fp8"}, "precision='fp8'"),
        ({"clip_grad_norm": 0.0}, "clip_grad_norm=0.0"),
        ({"step_fn": None}, "loss_fn=None"),
    ]:
        with pytest.raises(ValueError, match=needle.replace("[", r"\[")):
            _recipe(Indexed(4), **kwargs)
    with pytest.raises(ValueError, match="prefetch_factor=2: needs num_workers"):
        LoaderOptions(prefetch_factor=2)


def test_lr_schedule_multiplies_the_batch_scaled_lr_and_is_not_overwritten():
    recipe = _recipe(Indexed(4), lr_schedule=lambda seen: 0.5 if seen >= 100 else 1.0)  # base_lr 0.1
    ramp = LRRamp(0.2, 0.4, begin=10, steps=10)  # hybrid scaling moving the LR from 0.2 to 0.4
    # The factor on each group's own LR: batch-scaled LR / base LR, times the schedule's factor.
    assert lrs.lr_factor(recipe, ramp.at(15), samples_seen=50) == pytest.approx(3.0)
    assert lrs.lr_factor(recipe, ramp.at(25), samples_seen=150) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"lr_schedule\(3\)=-1.0"):
        lrs.lr_factor(_recipe(Indexed(4), lr_schedule=lambda s: -1.0), 0.1, 3)


def test_clipping_bounds_the_update_and_fp16_scaler_skips_an_overflowing_step():
    torch.manual_seed(0)
    model = nn.Linear(4, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    w0 = model.weight.detach().clone()
    model.weight.grad = torch.tensor([[3.0, 4.0, 0.0, 0.0]])  # norm 5
    steps.optimizer_step(opt, model, None, clip=1.0)
    assert torch.allclose(model.weight.detach(), w0 - torch.tensor([[0.6, 0.8, 0.0, 0.0]]))

    # fp16 on the CPU: the scaler unscales before clipping, and an inf gradient skips the step.
    scaler = steps.make_scaler("fp16", torch.device("cpu"))
    assert scaler is not None and steps.make_scaler("bf16", torch.device("cpu")) is None
    w1 = model.weight.detach().clone()
    opt.zero_grad()
    steps.backward((model.weight * torch.tensor([[3.0, 4.0, 0.0, 0.0]])).sum(), scaler)  # gradient (3, 4, 0, 0)
    steps.optimizer_step(opt, model, scaler, clip=1.0)
    assert torch.allclose(model.weight.detach(), w1 - torch.tensor([[0.6, 0.8, 0.0, 0.0]]))
    w2, scale = model.weight.detach().clone(), scaler.get_scale()
    opt.zero_grad()
    steps.backward((model.weight * torch.tensor([[math.inf, 0.0, 0.0, 0.0]])).sum(), scaler)
    steps.optimizer_step(opt, model, scaler, clip=1.0)
    assert torch.equal(model.weight.detach(), w2) and scaler.get_scale() == scale * 0.5


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_runs_the_forward_in_the_recipe_precision_on_cpu(precision):
    with steps.autocast(precision, torch.device("cpu")):
        out = nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def test_checkpoint_carries_the_grad_scaler_and_state_buckets_by_device_and_dtype(tmp_path):
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # the scale is created lazily, at the first scale()
    scaler.update(new_scale=256.0)
    meta = TrainMeta(step=1, samples_seen=4, global_batch=4, lr=LRRamp(0.1, 0.1), rng_state=b"")
    ElasticState(model, opt, meta, scaler).save(tmp_path)
    other = torch.amp.GradScaler("cpu")
    fresh = ElasticState(nn.Linear(3, 2), torch.optim.Adam(nn.Linear(3, 2).parameters()), meta, other)
    fresh.load(tmp_path)
    assert other.get_scale() == 256.0

    tensors = [torch.zeros(2), torch.zeros(1, dtype=torch.float64), torch.zeros(3, device="meta"), torch.ones(4), torch.zeros(5, device="meta")]
    got = buckets(tensors)
    # Own grouping: every bucket one (device, dtype), input order kept inside, nothing lost.
    assert [[t.numel() for t in b] for b in got] == [[2, 4], [1], [3, 5]]
    assert all(len({(t.device, t.dtype) for t in b}) == 1 for b in got)


def test_tiny_lm_loss_falls_within_seconds_on_cpu():
    torch.set_num_threads(1)
    recipe = tiny_lm(max_bytes=120_000)
    check_recipe(recipe)
    torch.manual_seed(0)
    model = recipe.build_model()
    opt = recipe.make_optimizer(model.parameters(), recipe.base_lr)
    losses = []
    for s in range(30):
        batch = recipe.collate([recipe.dataset[(s * 16 + i) % len(recipe.dataset)] for i in range(16)])
        opt.zero_grad()
        loss, _ = recipe.loss(model, batch)
        loss.backward()
        with lrs.scaled_lrs(opt, lrs.lr_factor(recipe, recipe.base_lr, s * 16)):
            steps.optimizer_step(opt, model, None, recipe.clip_grad_norm)
        losses.append(float(loss.detach()))
    # Uniform over 256 bytes is ln 256 = 5.55; stdlib source is far more predictable.
    assert losses[0] > 5.0 and np.mean(losses[-5:]) < 3.6


def test_entry_point_in_the_current_directory_imports_without_pythonpath(tmp_path, monkeypatch):
    (tmp_path / "cwd_recipe_mod.py").write_text("from elastic_tasks.examples import mlp_tiny\nrecipe = lambda: mlp_tiny(train_size=64)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_recipe_mod", raising=False)
    assert load_entry_point("cwd_recipe_mod:recipe").name == "mlp_tiny"
    with pytest.raises(EntryPointError, match="cannot import module 'no_such_mod_here'"):
        load_entry_point("no_such_mod_here:recipe")
