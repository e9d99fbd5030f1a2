"""Shared terminal helpers for CLI commands: one-line errors and warnings, exit codes scripts can
trust, and a quiet default for the libraries underneath (``-v`` lets them speak)."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import NoReturn

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

# Exit codes: 0 success, 1 the work itself failed, 2 bad input (file, flag, setting), 3 a wait
# that ran out of time (the jobs go on).
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_TIMEOUT = 3
# Interrupted (Ctrl-C / SIGTERM): the shell's convention, 128 + SIGINT.
EXIT_INTERRUPTED = 130



class _Console(Console):
    """Rich's width where it can see one (a terminal, or COLUMNS); piped, wide enough that no
    table cuts a policy name to "goo…" (rich would assume 80 columns). Decided at each print,
    not once at import: where the output goes, and COLUMNS, can change in one process."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._width = None  # rich fixes COLUMNS as it was at construction (an import): read it per print

    @property
    def size(self) -> ConsoleDimensions:
        seen = super().size
        if os.environ.get("COLUMNS", "").isdigit() or self.is_terminal:
            return seen
        return ConsoleDimensions(PIPED_WIDTH, seen.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


PIPED_WIDTH = 400
console = _Console()
err_console = _Console(stderr=True)

# Loggers that speak at INFO through a normal run (Dask's cluster start-up and shutdown,
# Prefect's flow-run chatter, MLflow's store migrations, the HTTP clients).
CHATTY_LOGGERS = ("distributed", "prefect", "mlflow", "alembic", "httpx", "urllib3", "asyncio", "tornado")
MLFLOW_DB_LOGGER = "mlflow.store.db.utils"


class _Verbosity:
    """``-v`` for this process (the CLI's root option sets it once): then an error line is
    followed by the traceback of the exception behind it, e.g. a user's entry point raising."""

    tracebacks = False


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one red line (no traceback unless ``-v``) and exit with ``code``."""
    # Escaped: a message that names ``TrainingRecipe[name].field`` must not read as rich markup.
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True, emoji=False)
    handled = sys.exc_info()[1]
    if _Verbosity.tracebacks and handled is not None:
        # The user's own exception (an EntryPointError keeps it as its cause), else the one handled.
        shown = handled.__cause__ or handled
        err_console.print("".join(traceback.format_exception(shown)), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def print_raw(text: str) -> None:
    """``text`` on stdout as is: tab-separated lines stay tab-separated (rich would expand the
    tabs to spaces and break ``cut -f1``)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def warn(message: str) -> None:
    """Print one yellow line on stderr; the command goes on."""
    err_console.print(f"[bold yellow]warning:[/] {message}", markup=True, highlight=False, soft_wrap=True)


def library_environment(verbose: bool) -> dict[str, str]:
    """Environment variables that keep Dask worker subprocesses and Prefect quiet by default.

    Read by processes started after they are set (Dask workers read ``DASK_LOGGING__*`` at
    import; Prefect reads its settings at import), so ``quiet_libraries`` sets them first.
    """
    always = {
        # Prefect's usage telemetry writes to its local database on first use and, when
        # another process holds it, prints "database is locked" tracebacks into our output.
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # The temporary server gets 20 s to start by default; on a loaded 2-core machine it
        # took longer and the command died with "Timed out ... ephemeral Prefect API server".
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    }
    if verbose:
        return always
    return {
        **always,
        "DASK_LOGGING__DISTRIBUTED": "error",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        # A failed flow or task run is logged with its traceback by Prefect's engine; the
        # command reports the same failure itself in one line.
        "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "CRITICAL",
        "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "CRITICAL",
        "PREFECT_SERVER_LOGGING_LEVEL": "ERROR",
        "MLFLOW_LOGGING_LEVEL": "WARNING",
    }


def quiet_libraries(verbose: bool = False) -> None:
    """Default output is ours: libraries log warnings and errors only, unless ``verbose``.

    A user's own ``PREFECT_*``/``DASK_*`` settings win (``setdefault``).
    """
    for name, value in library_environment(verbose).items():
        os.environ.setdefault(name, value)
    _Verbosity.tracebacks = verbose
    level = logging.INFO if verbose else logging.ERROR
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    # MLflow logs every failed SQLAlchemy call at ERROR with its traceback; our tracking
    # (service/tracking/buffered.py) catches those same failures, says once in a line what is
    # wrong and journals the calls, so MLflow's copy is only noise (-v shows it).
    logging.getLogger(MLFLOW_DB_LOGGER).setLevel(logging.INFO if verbose else logging.CRITICAL)
