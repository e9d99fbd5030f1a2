"""Put trial workers on instances so that each trial spans as few instances as it can (seed 001 §4.4).

The paper's rule: a trial that fits on one instance is placed whole on one instance
(best fit); a larger trial takes whole instances of its own, and only its remainder shares.
Biggest trials go first, so small ones fill the gaps. Only a trial that cannot be placed
whole is split, over the instances with the most free GPUs (fewest pieces). A trial that
spans instances pays the cross-instance allreduce in the execution model.

``scattered=True`` is the placement-unaware baseline (the paper's Table 1 ablation): GPUs
are dealt round-robin over instances, as a scheduler with no locality hint would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class TrialPlacement:
    """Where one trial's workers run: ``(instance index, GPUs there)`` pairs."""

    trial: int
    pieces: tuple[tuple[int, int], ...]

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.pieces)

    @property
    def instances(self) -> int:
        return len(self.pieces)


@dataclass(frozen=True, slots=True)
class Placement:
    instances: int
    gpus_per_instance: int
    trials: tuple[TrialPlacement, ...]

    def spans(self) -> tuple[int, ...]:
        """Instances each trial spans, in trial order."""
        return tuple(t.instances for t in sorted(self.trials, key=lambda t: t.trial))

    def minimal(self, trial: TrialPlacement) -> bool:
        """Whether a trial spans no more instances than its size forces."""
        return trial.instances <= -(-trial.gpus // self.gpus_per_instance)


def place(demands: Sequence[int], instances: int, gpus_per_instance: int, *, scattered: bool = False) -> Placement:
    """Assign each trial's GPU demand to instances; ValueError if they do not fit."""
    if instances < 0 or gpus_per_instance <= 0:
        raise ValueError(f"place: instances={instances}, gpus_per_instance={gpus_per_instance}: must be >= 0 and > 0")
    for i, d in enumerate(demands):
        if not isinstance(d, int) or d <= 0:
            raise ValueError(f"place: demands[{i}]={d!r}: must be a positive integer")
    if sum(demands) > instances * gpus_per_instance:
        raise ValueError(f"place: demands total {sum(demands)} GPUs > {instances} instances x {gpus_per_instance}")
    free = [gpus_per_instance] * instances
    pieces: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(demands))}
    if scattered:
        node = 0
        for i, d in enumerate(demands):
            for _ in range(d):
                while free[node] == 0:
                    node = (node + 1) % instances
                free[node] -= 1
                _add(pieces[i], node, 1)
                node = (node + 1) % instances
    else:
        for i in sorted(range(len(demands)), key=lambda j: (-demands[j], j)):
            _place_one(pieces[i], demands[i], free, gpus_per_instance)
    return Placement(instances, gpus_per_instance, tuple(TrialPlacement(i, tuple(pieces[i])) for i in range(len(demands))))


def _add(piece_list: list[tuple[int, int]], node: int, gpus: int) -> None:
    for k, (n, g) in enumerate(piece_list):
        if n == node:
            piece_list[k] = (n, g + gpus)
            return
    piece_list.append((node, gpus))


def _place_one(out: list[tuple[int, int]], demand: int, free: list[int], size: int) -> None:
    left = demand
    # Whole instances first for trials at least one instance big.
    for node in range(len(free)):
        if left < size:
            break
        if free[node] == size:
            free[node] = 0
            out.append((node, size))
            left -= size
    if left == 0:
        return
    fits = [n for n in range(len(free)) if free[n] >= left]
    if fits:
        node = min(fits, key=lambda n: (free[n], n))  # best fit keeps big holes for big trials
        free[node] -= left
        _add(out, node, left)
        return
    for node in sorted(range(len(free)), key=lambda n: (-free[n], n)):
        if left == 0:
            break
        take = min(free[node], left)
        if take:
            free[node] -= take
            _add(out, node, take)
            left -= take


@lru_cache(maxsize=4096)
def stage_spans(trials: int, gpus_per_trial: int, instances: int, gpus_per_instance: int, scattered: bool = False) -> tuple[int, ...]:
    """Spans of ``trials`` equal trials placed together; cached because the planner asks often."""
    return place([gpus_per_trial] * trials, instances, gpus_per_instance, scattered=scattered).spans()
