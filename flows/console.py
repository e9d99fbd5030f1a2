"""Shared terminal helpers for CLI commands: one-line errors and exit codes scripts can trust."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

# Exit codes: 0 success, 1 the work itself failed, 2 bad input (file, flag, setting).
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one red line (no traceback) and exit with ``code``."""
    # Escaped: a message that names ``TrainingRecipe[name].field`` must not read as rich markup.
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code)
