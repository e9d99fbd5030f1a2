"""Evaluation of a job, periodic and final: the recipe's ``eval_fn`` or its training objective.

Memory: evaluation never reads a batch larger than training held on one GPU — the job's
``max_batch_per_gpu`` when it has one, else one rank's share of the global batch (at most
``EVAL_BATCH``). A large model trained at micro-batch 8 is evaluated at 8, not at 256 (which
ran out of GPU memory after the last checkpoint and failed the job).

Where: on rank 0 alone, or sharded (``recipe.eval_sharded``): each rank reads a contiguous
slice of the eval set and ``EvalLoader.gather`` puts per-sample tensors back together in
dataset order on every rank, so a metric over the whole set (macro-F1) is computed exactly,
not averaged per batch. One forward per batch: ``eval_fn`` computes its loss and metrics from
the same outputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from elastic_tasks.rank.state.elastic import ElasticState

from elastic_tasks.protocol import EvalResult
from elastic_tasks.rank import lr as lrs
from elastic_tasks.rank.agreement import Agreed
from elastic_tasks.rank.health.collective import collective
from elastic_tasks.rank.evaluation.schedule import EvalSchedule
from elastic_tasks.rank.step import autocast
from elastic_tasks.recipe import TrainingRecipe, to_device

EVAL_BATCH = 256


class EvalMetricsError(ValueError):
    """``eval_fn`` returned something other than ``{name: number}``."""


def eval_batch_size(max_batch_per_gpu: int | None, global_batch: int, world: int) -> int:
    """The largest batch one GPU evaluates: the job's per-GPU cap, else one rank's training share (≤ EVAL_BATCH)."""
    if max_batch_per_gpu is not None:
        return max_batch_per_gpu
    return max(1, min(EVAL_BATCH, -(-global_batch // max(world, 1))))


class EvalLoader:
    """What ``eval_fn(model, loader)`` iterates: this rank's part of the eval set, in order,
    in batches of at most ``batch_size``, already on the model's device.

    ``gather(tensor)``: the per-sample ``tensor`` of every rank concatenated in dataset order
    (sharded evaluation; a collective, so every rank calls it the same number of times);
    unsharded it returns ``tensor`` itself. ``rank`` and ``world`` say which part this is
    (the pre-flight check has no process group, so ``torch.distributed`` cannot tell).
    """

    def __init__(self, recipe: TrainingRecipe, device: torch.device, batch_size: int, rank: int = 0, world: int = 1, sharded: bool = False) -> None:
        dataset = recipe.eval_dataset
        if dataset is None:
            raise ValueError(f"TrainingRecipe[{recipe.name}].eval_dataset=None: nothing to evaluate")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ValueError(f"eval batch_size={batch_size!r}: must be a positive integer")
        self.recipe = recipe
        self.dataset = dataset
        self.device = device
        self.batch_size = batch_size
        self.sharded = sharded and world > 1
        self.rank, self.world = rank, world
        n = len(dataset)  # type: ignore[arg-type]
        # Contiguous slices in rank order: concatenating them is the dataset's order.
        self.start, self.stop = (n * rank // world, n * (rank + 1) // world) if self.sharded else (0, n)
        self.total = n

    def __len__(self) -> int:
        return -(-(self.stop - self.start) // self.batch_size)

    def sized_batches(self) -> Iterator[tuple[int, Any]]:
        """(samples, batch) pairs."""
        for start in range(self.start, self.stop, self.batch_size):
            stop = min(self.stop, start + self.batch_size)
            samples = [self.dataset[i] for i in range(start, stop)]
            yield stop - start, to_device(self.recipe.collate(samples), self.device)

    def __iter__(self) -> Iterator[Any]:
        for _, batch in self.sized_batches():
            yield batch

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.sharded:
            return tensor
        parts: list[Any] = [None] * dist.get_world_size()
        # Objects, not tensors: shards differ in length, and this works on gloo and nccl alike
        # (an evaluation's outputs are small next to a gradient allreduce).
        dist.all_gather_object(parts, tensor.detach().cpu())
        return torch.cat(parts).to(tensor.device)


def evaluate(recipe: TrainingRecipe, model: nn.Module, loader: EvalLoader, step: int | None = None) -> EvalResult:
    """One evaluation with the model in eval mode, no gradients, the recipe's precision."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast(recipe.precision, loader.device):
            if recipe.eval_fn is not None:
                metrics = _numbers(recipe, recipe.eval_fn(model, loader))
                return EvalResult(metrics.get("loss"), None, loader.total, tuple(sorted(metrics.items())), step)
            return _objective(recipe, model, loader, step)
    finally:
        model.train(was_training)


def _objective(recipe: TrainingRecipe, model: nn.Module, loader: EvalLoader, step: int | None) -> EvalResult:
    """Without ``eval_fn``: the training objective and, for ``(x, y)`` classifiers, accuracy;
    the older per-batch ``eval_metrics`` are sample-weighted means."""
    total_loss, total_correct, counted = 0.0, 0.0, False
    sums: dict[str, float] = {}
    n = loader.stop - loader.start
    for size, batch in loader.sized_batches():
        loss, correct = recipe.loss(model, batch)
        total_loss += float(loss) * size
        if correct is not None:
            total_correct, counted = total_correct + float(correct), True
        if recipe.eval_metrics is not None:
            for name, value in _numbers(recipe, recipe.eval_metrics(model, batch), "eval_metrics").items():
                sums[name] = sums.get(name, 0.0) + value * size
    return EvalResult(total_loss / n, total_correct / n if counted else None, n, tuple(sorted((k, v / n) for k, v in sums.items())), step)


def _numbers(recipe: TrainingRecipe, metrics: Mapping[str, Any], field: str = "eval_fn") -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        raise EvalMetricsError(f"TrainingRecipe[{recipe.name}].{field}: returned {type(metrics).__name__}, expected a dict of name -> number")
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise EvalMetricsError(f"TrainingRecipe[{recipe.name}].{field}: {name!r} -> {value!r} is not str -> number")
        out[name] = float(value)
    return out


class RankEvaluation:
    """A rank's part in its job's evaluations, periodic and final, at the per-GPU cap."""

    def __init__(self, recipe: TrainingRecipe, max_batch_per_gpu: int | None, device: torch.device) -> None:
        self.recipe = recipe
        self.max_batch_per_gpu = max_batch_per_gpu
        self.device = device
        self.schedule = EvalSchedule(recipe.eval_every, recipe.eval_every_s)
        self.periodic = self.schedule.periodic  # fixed by the recipe: asked every step

    def run(self, state: ElasticState, rank: int, world: int) -> EvalResult:
        """This rank's part of one evaluation (all of it, unless sharded)."""
        meta = state.meta
        batch = eval_batch_size(self.max_batch_per_gpu, meta.global_batch, world)
        loader = EvalLoader(self.recipe, self.device, batch, rank, world, self.recipe.eval_sharded)
        with collective(f"evaluation at step {meta.step}"):
            return evaluate(self.recipe, state.model, loader, meta.step)

    def due(self, state: ElasticState, agreed: Agreed | None, done: bool) -> bool:
        """Whether a periodic evaluation is due at this step boundary (what ``if_due`` decides on)."""
        if done or not self.schedule.periodic:
            return False
        read = (agreed.record.step, agreed.eval_clock) if agreed is not None else (None, 0.0)
        return self.schedule.due(state.meta.step, *read)

    def if_due(self, state: ElasticState, rank: int, world: int, agreed: Agreed | None, done: bool) -> EvalResult | None:
        """A periodic evaluation at this step boundary, decided alike on every rank (evaluation/schedule.py);
        its result on the ranks that computed or received it. The job's end has its own."""
        if not self.due(state, agreed, done):
            return None
        steps_done = state.meta.step
        sharded = self.recipe.eval_sharded
        result = self.run(state, rank, world) if rank == 0 or sharded else None
        if lrs.is_metric_driven(state.scheduler) and not sharded and world > 1:
            shared = [result]
            with collective(f"evaluation results at step {steps_done}"):
                dist.broadcast_object_list(shared, src=0)  # every rank steps the scheduler alike
            result = shared[0]
        self.schedule.evaluated(steps_done)
        if result is not None:
            metrics = dict(result.metrics) | ({} if result.loss is None else {"loss": result.loss})
            lrs.after_evaluation(self.recipe, state.scheduler, metrics)
        return result
