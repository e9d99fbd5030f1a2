"""The rank's Dask task as the client submits it: a module-level function that imports the
trainer (torch, torch.distributed, DDP) only when it runs, on the worker.

Dask pickles a module-level function by reference (module and name), so the submitting process
(the service, ``malleable run``) never imports torch for it: a `malleable serve` that imported
the trainer to submit ranks spent seconds of its start on torch (issue 28, recovery). Workers
import the trainer once, ahead of the first rank (``elastic_tasks.cluster.warm_up_trainer``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elastic_tasks.protocol import RankResult, RankSpec
    from elastic_tasks.recipe import TrainingRecipe


def run_rank(spec: RankSpec) -> RankResult:
    """Dask task: ``elastic_tasks.rank.trainer.run_rank`` (see there)."""
    from elastic_tasks.rank.trainer import run_rank as train

    return train(spec)


def build_recipe(entrypoint: str) -> TrainingRecipe:
    """The recipe built in this process (``load_entry_point``), so that a broken one fails before
    any rank task exists: ``JobCoordinator`` does it by default. It imports torch and the user's
    module here, so the service skips it (``build_recipe_here=False``): its feed has found the
    module already, and a recipe that fails to build fails the job from its ranks."""
    from elastic_tasks.recipe import load_entry_point

    return load_entry_point(entrypoint)
