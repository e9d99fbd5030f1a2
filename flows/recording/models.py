"""A trained model as MLflow users expect it: MLflow's pytorch flavour with a signature and an
input example, and a version in the model registry under a name the user chooses."""

from __future__ import annotations

from pathlib import Path

import torch

from elastic_tasks.rank.state.elastic import read_checkpoint
from elastic_tasks.recipe import TrainingRecipe, collate, load_entry_point
from service.redaction import redact_url


def _example(recipe: TrainingRecipe, model: torch.nn.Module) -> tuple[object, object] | None:
    """Two samples of the recipe's dataset and the model's output on them (numpy), or None where
    the recipe's batches are not plain ``(x, y)`` tensors (then the model is saved without)."""
    try:
        x, _ = collate(recipe.dataset, range(min(2, len(recipe.dataset))))  # type: ignore[arg-type]
        with torch.no_grad():
            y = model(x)
    except Exception:  # noqa: BLE001 - a recipe with its own batch structure: no example, still a model
        return None
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return None
    return x.numpy(), y.numpy()


def save_model_dir(entrypoint: str, checkpoint_dir: Path | str, out: Path) -> Path:
    """The final checkpoint's weights in the recipe's model, saved in MLflow's pytorch format with
    a signature and an input example when the recipe's batches allow one."""
    import mlflow.pytorch
    from mlflow.models import infer_signature

    recipe = load_entry_point(entrypoint)
    model = recipe.build_model()
    payload = read_checkpoint(checkpoint_dir)  # a path or a URL (s3://…): where the ranks wrote it
    model.load_state_dict(payload["model"])
    model.eval()
    example = _example(recipe, model)
    extra = {} if example is None else {"signature": infer_signature(*example), "input_example": example[0]}
    # "pickle": the default "pt2" exports the model with torch.export, which not every model survives.
    mlflow.pytorch.save_model(model, str(out), serialization_format="pickle", pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"], **extra)
    return out


def register_model(tracking_uri: str, run_id: str, name: str, artifact_path: str = "model") -> int | None:
    """A new version of registered model ``name`` from the run's ``artifact_path``; its number, or
    None (with one line printed) when the registry refuses or cannot be reached."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri)
    try:
        try:
            client.create_registered_model(name)
        except MlflowException as exc:
            if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
                raise
        source = f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{artifact_path}"
        return int(client.create_model_version(name, source, run_id=run_id).version)
    except Exception as exc:  # noqa: BLE001 - the model is logged; only its registration is missing
        print(f"model not registered as {name!r} at {redact_url(tracking_uri)}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return None
