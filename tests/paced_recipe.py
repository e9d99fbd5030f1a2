"""A recipe for service tests whose job must stay running until the test has seen what it waits
for: mlp_tiny, each step slowed in proportion to its batch while a file the test holds exists.

A job sized to outlast a test's waits by its number of samples alone must be sized for the
slowest box, so on every other box it trains (and burns CPU) far longer than needed. Paced, the
job's length is the test's choice: slow and nearly idle while the pace file exists (the test
watches an allocation, a crash, a resume), at full speed once the test removes it (what is left
then trains in seconds). The pause is per sample, so a paced step still costs in proportion to
its batch, as the tests' compute-heavy profile models it, and ranks added in parallel speed the
job up as the profile predicts. Without ``$MALLEABLE_TEST_PACE_FILE`` it is mlp_tiny.
(Imported by the Dask workers as an entry point; the variable reaches them in the service's
environment.)"""

import dataclasses
import os
import time

import torch.nn.functional as F

from elastic_tasks.examples.recipes import mlp_tiny
from elastic_tasks.recipe import TrainingRecipe

PACE_FILE_ENV = "MALLEABLE_TEST_PACE_FILE"
ENTRY = "tests.paced_recipe:mlp_paced"
# 64 samples (a rank's largest batch in the tests' profile): 0.26 s a step, against ~10 ms computing.
PACE_S_PER_SAMPLE = 0.004


def _paced_cross_entropy(logits, target):  # noqa: ANN001, ANN202
    pace_file = os.environ.get(PACE_FILE_ENV)
    if pace_file and os.path.exists(pace_file):
        time.sleep(PACE_S_PER_SAMPLE * len(target))
    return F.cross_entropy(logits, target)


def mlp_paced() -> TrainingRecipe:
    return dataclasses.replace(mlp_tiny(), name="mlp_paced", loss_fn=_paced_cross_entropy)
