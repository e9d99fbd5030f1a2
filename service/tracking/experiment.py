"""The MLflow experiment every tracker writes into, found or created (``mlflow`` imported on use)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse


def artifact_root(tracking_uri: str, state_dir: Path | str) -> str | None:
    """Where a new experiment's artifacts go, chosen here rather than left to MLflow (which
    would put them in ``./mlruns`` of whatever directory the creating process ran in).

    A sqlite store: ``mlartifacts`` beside its database file. A tracking server (http(s),
    databricks): None, the server's own ``--default-artifact-root`` / artifact proxy decides.
    Any other database: ``<state_dir>/mlartifacts``.
    """
    parsed = urlparse(tracking_uri)
    if parsed.scheme in ("http", "https", "databricks") or tracking_uri == "databricks":
        return None
    if parsed.scheme == "sqlite" and tracking_uri.startswith("sqlite:///") and ":memory:" not in tracking_uri:
        return (Path(unquote(tracking_uri[len("sqlite:///") :])).resolve().parent / "mlartifacts").as_uri()
    return (Path(state_dir).resolve() / "mlartifacts").as_uri()


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
