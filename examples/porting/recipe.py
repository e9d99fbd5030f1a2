"""plain_loop.py as a recipe: ``malleable train recipe:recipe --gpus 2 --rescale-at 10:3 --steps 30`` from this directory."""

from elastic_tasks.recipe import TrainingRecipe
from plain_loop import BATCH, EVAL_EVERY, LR, Classifier, Rows, eval_set, evaluate, make_optimizer, make_scheduler


def step_fn(model, batch):  # model: the module build_model returned, never the DDP wrapper
    return model.compute_loss(batch)


def recipe():
    return TrainingRecipe(
        name="rows",
        build_model=Classifier,
        dataset=Rows(),
        step_fn=step_fn,
        make_optimizer=make_optimizer,  # takes named_parameters: groups built by name
        make_scheduler=make_scheduler,  # OneCycleLR, stepped once per step
        base_lr=LR,
        base_batch=BATCH,
        eval_dataset=eval_set(),
        eval_fn=evaluate,  # evaluate(model, loader) -> {"macro_f1", "loss"}
        eval_every=EVAL_EVERY,
    )
