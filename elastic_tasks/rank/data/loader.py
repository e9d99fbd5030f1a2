"""Each rank's DataLoader over the elastic sample stream.

The stream (``sharding.EpochSampler``) decides which indices a step takes; this module only
turns one generation's share of it into a ``DataLoader`` — the recipe's ``collate_fn``,
worker processes, pinned memory, prefetch — that yields the rank's micro-batches step after
step from a given stream position. A generation change re-aims it at the new position and
discards whatever it had prefetched, so a rescale mid-epoch neither repeats nor skips a
sample: the position is the only state, and it travels.

torchdata's StatefulDataLoader was considered: it checkpoints a loader of a *fixed* world
size; here the world changes, and the position is already an integer every rank agrees on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, Sampler

from elastic_tasks.recipe import TrainingRecipe, collate_function
from elastic_tasks.rank.scaling import micro_batches
from elastic_tasks.rank.data.sharding import EpochSampler, rank_slice


def step_micro_batches(sampler: EpochSampler, samples_seen: int, global_batch: int, world: int, rank: int, accum: int) -> Iterator[list[int]]:
    """Rank ``rank``'s micro-batches of indices, step after step from stream position ``samples_seen``."""
    lo, hi = rank_slice(global_batch, world, rank)
    sampler.step_indices(samples_seen, global_batch)  # the arguments checked once; each step's position follows from them
    chunks = micro_batches(hi - lo, accum)  # the same split every step
    position = samples_seen
    while True:
        local = sampler.indices(position, global_batch)[lo:hi]
        for a, b in chunks:
            yield local[a:b].tolist()  # Python ints, as a sampler gives them (one call, not one per index)
        position += global_batch


class _StreamSampler(Sampler[list[int]]):
    """The rank's current share of the stream; re-aimed (``aim``) at each generation change."""

    def __init__(self, sampler: EpochSampler) -> None:
        self.sampler = sampler
        self._args: tuple[int, int, int, int, int] | None = None

    def aim(self, samples_seen: int, global_batch: int, world: int, rank: int, accum: int) -> None:
        self._args = (samples_seen, global_batch, world, rank, accum)

    def __iter__(self) -> Iterator[list[int]]:
        if self._args is None:
            raise RuntimeError("RankLoader.start() was not called")
        return step_micro_batches(self.sampler, *self._args)


class RankLoader:
    """One rank's DataLoader for its whole life: ``start`` re-aims it at a generation's share.

    With loader workers the DataLoader is persistent: a new generation reuses the worker
    processes (``iter`` on a persistent loader resets it, draining and discarding what the
    workers had prefetched for the old share) instead of starting new ones inside the
    rescale pause. The index stream itself is drawn in the rank's process, from the position
    given, so nothing prefetched for the old generation is ever delivered to the new one.
    """

    def __init__(self, recipe: TrainingRecipe, sampler: EpochSampler) -> None:
        opts = recipe.loader
        extra: dict[str, Any] = {}
        if opts.num_workers:
            extra = {"prefetch_factor": opts.prefetch_factor, "persistent_workers": True}
        self._stream = _StreamSampler(sampler)
        self.loader: DataLoader[Any] = DataLoader(
            recipe.dataset,
            batch_sampler=self._stream,
            collate_fn=collate_function(recipe),  # not the recipe's bound method: workers pickle what the loader holds
            num_workers=opts.num_workers,
            pin_memory=opts.pin_memory,
            **extra,
        )

    def start(self, samples_seen: int, global_batch: int, world: int, rank: int, accum: int) -> Iterator[Any]:
        """An endless iterator of this rank's micro-batches from stream position ``samples_seen``."""
        self._stream.aim(samples_seen, global_batch, world, rank, accum)
        return iter(self.loader)


def rank_loader(recipe: TrainingRecipe, sampler: EpochSampler, samples_seen: int, global_batch: int, world: int, rank: int, accum: int) -> Iterator[Any]:
    """A one-off iterator over the rank's micro-batches (tests, scripts); ranks keep a ``RankLoader``."""
    return RankLoader(recipe, sampler).start(samples_seen, global_batch, world, rank, accum)
