"""Successive halving's keep rule (allocator/hpo/selection.py), checked by hand."""

import math

import pytest

from allocator.hpo.selection import keep_best, survivors, trial_score
from allocator.hpo.spec import Stage


def test_score_prefers_eval_loss_then_training_loss_then_ranks_last():
    assert trial_score(0.5, 0.1) == 0.5
    assert trial_score(None, 0.1) == 0.1
    assert trial_score(None, None) == math.inf


def test_keep_best_ranks_by_score_breaks_ties_by_trial_and_lists_in_trial_order():
    scores = [(3, 0.2), (0, 0.9), (2, 0.2), (1, 0.1), (4, math.inf)]
    assert keep_best(scores, 2) == (1, 2)  # 0.1, then the tie at 0.2 goes to trial 2 over 3
    assert keep_best(scores, 3) == (1, 2, 3)
    assert keep_best(scores, 9) == (0, 1, 2, 3, 4)
    with pytest.raises(ValueError, match="keep=0"):
        keep_best(scores, 0)


def test_survivors_are_the_next_stages_trials_and_one_at_the_end():
    stages = (Stage(8, 10), Stage(4, 20), Stage(2, 40))
    assert [survivors(stages, i) for i in range(3)] == [4, 2, 1]
    with pytest.raises(ValueError, match="stage=3"):
        survivors(stages, 3)
