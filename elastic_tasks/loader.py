"""Each rank's DataLoader over the elastic sample stream.

The stream (``sharding.EpochSampler``) decides which indices a step takes; this module only
turns one generation's share of it into a ``DataLoader`` — the recipe's ``collate_fn``,
worker processes, pinned memory, prefetch — that yields the rank's micro-batches step after
step from a given stream position. A generation change builds a new loader from the new
position and drops the old one with whatever it had prefetched, so a rescale mid-epoch
neither repeats nor skips a sample: the position is the only state, and it travels.

torchdata's StatefulDataLoader was considered: it checkpoints a loader of a *fixed* world
size; here the world changes, and the position is already an integer every rank agrees on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, Sampler

from elastic_tasks.recipe import TrainingRecipe
from elastic_tasks.scaling import micro_batches
from elastic_tasks.sharding import EpochSampler, rank_slice


def step_micro_batches(sampler: EpochSampler, samples_seen: int, global_batch: int, world: int, rank: int, accum: int) -> Iterator[list[int]]:
    """Rank ``rank``'s micro-batches of indices, step after step from stream position ``samples_seen``."""
    lo, hi = rank_slice(global_batch, world, rank)
    position = samples_seen
    while True:
        local = sampler.step_indices(position, global_batch)[lo:hi]
        for a, b in micro_batches(len(local), accum):
            yield [int(i) for i in local[a:b]]
        position += global_batch


class _StreamSampler(Sampler[list[int]]):
    def __init__(self, sampler: EpochSampler, samples_seen: int, global_batch: int, world: int, rank: int, accum: int) -> None:
        self._args = (sampler, samples_seen, global_batch, world, rank, accum)

    def __iter__(self) -> Iterator[list[int]]:
        return step_micro_batches(*self._args)


def rank_loader(recipe: TrainingRecipe, sampler: EpochSampler, samples_seen: int, global_batch: int, world: int, rank: int, accum: int) -> DataLoader[Any]:
    """An endless DataLoader of this rank's micro-batches (the trainer takes as many as each step needs)."""
    opts = recipe.loader
    extra: dict[str, Any] = {}
    if opts.num_workers:
        extra["prefetch_factor"] = opts.prefetch_factor
    return DataLoader(
        recipe.dataset,
        batch_sampler=_StreamSampler(sampler, samples_seen, global_batch, world, rank, accum),
        collate_fn=recipe.collate,
        num_workers=opts.num_workers,
        pin_memory=opts.pin_memory,
        **extra,
    )
