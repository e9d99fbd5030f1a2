"""Shared terminal helpers for CLI commands: one-line errors and exit codes scripts can trust."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

# Exit codes: 0 success, 1 the work itself failed, 2 bad input (file, flag, setting).
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one red line (no traceback) and exit with ``code``.

    The message is plain text: brackets in it (``[1, 4]``, ``jobs[0]``) are shown, not read as markup.
    """
    one_line = " ".join(message.split())  # an exception's text may span lines; the error is one
    err_console.print(Text.assemble(("error:", "bold red"), " ", one_line), highlight=False, soft_wrap=True)
    raise typer.Exit(code)
