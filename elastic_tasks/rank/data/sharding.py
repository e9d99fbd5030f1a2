"""Deterministic data sharding that survives any number of rescales.

The sample stream of a job is the concatenation of per-epoch permutations (seeded by the job
seed and the epoch). A global step takes the next ``global_batch`` positions of that stream,
whatever the world size; rank ``r`` of ``w`` takes its contiguous slice of the step, and
uneven splits are allowed. The only state is ``samples_seen``, so a rank that joins mid-run
needs one integer to know exactly which samples come next, and every sample of an epoch is
seen exactly once across rescales (a step that straddles an epoch boundary finishes one
epoch and starts the next).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _check_int(owner: str, name: str, value: int, minimum: int) -> None:
    if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum):
        raise ValueError(f"{owner}.{name}={value!r}: must be an integer >= {minimum}")


@dataclass(slots=True)
class EpochSampler:
    """Positions of the job's sample stream -> dataset indices. Caches the last permutations."""

    num_samples: int
    seed: int = 0
    _cache: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _check_int("EpochSampler", "num_samples", self.num_samples, 1)
        _check_int("EpochSampler", "seed", self.seed, 0)

    def permutation(self, epoch: int) -> np.ndarray:
        perm = self._cache.get(epoch)
        if perm is None:
            # Seeded by (seed, epoch) alone: every process, joined at any time, derives the same order.
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = perm
        return perm

    def epoch_of(self, samples_seen: int) -> int:
        return samples_seen // self.num_samples

    def step_indices(self, samples_seen: int, global_batch: int) -> np.ndarray:
        """Dataset indices of the step that starts at stream position ``samples_seen``."""
        _check_int("EpochSampler", "samples_seen", samples_seen, 0)
        _check_int("EpochSampler", "global_batch", global_batch, 1)
        return self.indices(samples_seen, global_batch)

    def indices(self, samples_seen: int, global_batch: int) -> np.ndarray:
        """``step_indices`` of arguments already checked (a rank's loader, every step)."""
        out = []
        pos, need = samples_seen, global_batch
        while need > 0:
            epoch, offset = divmod(pos, self.num_samples)
            take = min(need, self.num_samples - offset)
            out.append(self.permutation(epoch)[offset : offset + take])
            pos += take
            need -= take
        return out[0] if len(out) == 1 else np.concatenate(out)


def rank_slice(global_batch: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's share of a global step; the first ``batch % world`` ranks take one more."""
    _check_int("rank_slice", "world_size", world_size, 1)
    if not (0 <= rank < world_size):
        raise ValueError(f"rank_slice.rank={rank!r}: must be in [0, {world_size})")
    if global_batch < world_size:
        raise ValueError(f"global_batch={global_batch!r}: must be >= world_size={world_size} so every rank gets a sample")
    base, extra = divmod(global_batch, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
