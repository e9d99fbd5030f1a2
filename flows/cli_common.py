"""Helpers shared by this package's CLI commands: settings that fail as one line."""

from __future__ import annotations

from flows.console import fail
from flows.settings import Settings, SettingsError, load_settings


def settings_or_fail(**overrides: object) -> Settings:
    """Load settings (flags win over ``MALLEABLE_*``); a bad value exits 2 with one line."""
    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        fail(str(exc))


def prefect_state_or_fail() -> None:
    """A damaged local Prefect database exits 2 with one line naming it, before any flow starts."""
    from flows.local_state import DamagedStateError, check_prefect_database

    try:
        check_prefect_database()
    except DamagedStateError as exc:
        fail(str(exc))


def ui_commands(settings: Settings) -> list[tuple[str, str]]:
    """(what, command) pairs to look at results in the MLflow and Prefect UIs."""
    uri = settings.resolved_tracking_uri
    if uri.startswith("http"):
        mlflow = f"open {uri}"
    else:
        mlflow = f"mlflow ui --backend-store-uri {uri} --port 5000   # then open http://127.0.0.1:5000"
    return [
        ("MLflow", mlflow),
        ("Prefect", "prefect server start   # then open http://127.0.0.1:4200 (runs made with an ephemeral API are kept in ~/.prefect)"),
    ]
