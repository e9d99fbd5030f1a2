"""Successive halving's keep rule (seed 001): after a stage, rank its trials and keep as many
as the next stage runs; stop the rest."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from allocator.hpo.spec import Stage


def trial_score(eval_loss: float | None, final_loss: float | None) -> float:
    """Lower is better: the evaluation loss, else the last training loss, else +inf (a trial
    that reported neither ranks last)."""
    for value in (eval_loss, final_loss):
        if value is not None:
            return value
    return math.inf


def survivors(stages: Sequence[Stage], stage: int) -> int:
    """How many trials ``stage`` hands on: the next stage's trial count, 1 after the last."""
    if not 0 <= stage < len(stages):
        raise ValueError(f"stage={stage}: the spec has stages 0..{len(stages) - 1}")
    return stages[stage + 1].trials if stage + 1 < len(stages) else 1


def keep_best(scores: Iterable[tuple[int, float]], keep: int) -> tuple[int, ...]:
    """The ``keep`` best (trial, score) pairs' trials, in trial order; ties go to the lower
    trial number, so the choice is a pure function of the scores."""
    if keep < 1:
        raise ValueError(f"keep={keep}: must be >= 1")
    ranked = sorted(scores, key=lambda pair: (pair[1], pair[0]))
    return tuple(sorted(trial for trial, _ in ranked[:keep]))
