"""The MLflow experiment every tracker writes into, found or created (``mlflow`` imported on use)."""

from __future__ import annotations


def ensure_experiment(client: object, name: str, artifact_location: str | None = None) -> str:
    """The experiment's id, creating it if missing. Two writers starting at once (a flow and the
    service it submits to, two submitters) both find it missing; the loser of the create reads
    the winner's instead of failing."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id
