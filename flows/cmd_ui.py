"""``malleable ui``: how to look at runs in the MLflow and Prefect UIs (prints; starts nothing)."""

from __future__ import annotations

from rich.table import Table

from flows.cli_common import settings_or_fail, ui_commands
from flows.console import console


def ui() -> None:
    """Print the commands that open the MLflow and Prefect UIs for this project's settings."""
    settings = settings_or_fail()
    table = Table(title="Look at the results", show_lines=False)
    table.add_column("UI")
    table.add_column("command")
    for what, command in ui_commands(settings):
        table.add_row(what, command)
    console.print(table)
