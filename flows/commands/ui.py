"""``malleable ui``: how to look at runs in the MLflow and Prefect UIs (prints; starts nothing)."""

from __future__ import annotations

from flows.commands.shared.common import settings_or_fail, ui_commands
from flows.commands.shared.console import console


def ui() -> None:
    """Print the commands that open the MLflow and Prefect UIs for this project's settings."""
    settings = settings_or_fail()
    # Plain lines, never wrapped into table cells: people copy these commands.
    for what, command in ui_commands(settings):
        console.print(f"{what}: {command}", soft_wrap=True, highlight=False, markup=False)
