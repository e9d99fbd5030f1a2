"""The ``malleable`` command line: one typer app, one module per command group.

Each command lives in its own ``flows/commands/*.py`` module (which never imports another
command's). This file only names them: a
command's module is imported when that command runs (or its own ``--help`` is asked for),
so ``malleable --help`` and ``--version`` never import torch, Prefect, MLflow or Dask.
Adding a command is one row in ``COMMANDS``.
"""

from __future__ import annotations

import gc
import importlib
import sys

from deploy.worker_env import conceal_secrets
from flows.commands.shared import stop_latch

# First of all (stdlib only): no child of this process (Dask workers running submitted code,
# Prefect's server) inherits the store's or the tracking server's credentials, and
# /proc/<this pid>/environ stops showing them (deploy/worker_env.py).
conceal_secrets()
# Before click and typer are imported: `malleable serve` handles SIGTERM from its first instant.
stop_latch.arm(sys.argv)
from dataclasses import dataclass
from typing import Annotated

import click
import typer
from typer.core import TyperGroup


@dataclass(frozen=True, slots=True)
class LazyCommand:
    """One CLI command: its name, ``module:attribute`` (a function or a ``typer.Typer``), and its
    docstring's first line (a test keeps the two equal) for the root help."""

    name: str
    target: str
    summary: str


COMMANDS: tuple[LazyCommand, ...] = (
    LazyCommand("quickstart", "flows.commands.quickstart:quickstart", "Run the cluster flow on a LocalCluster: three jobs arrive, elastic_dp grows and shrinks them in place."),
    LazyCommand("run", "flows.commands.run:run", "Run a jobs file through the autoscaling loop: real elastic training on Dask workers, or simulated."),
    LazyCommand("train", "flows.commands.train:train", "Train one job elastically on a local Dask cluster and print a summary."),
    LazyCommand("profile", "flows.commands.profile:profile_command", "Measure per-iteration time over a batch ladder and allreduce time; print and save the profile."),
    LazyCommand("plan", "flows.commands.plan:plan", "Show the GPUs and batch size a policy gives each job, with predicted throughput."),
    LazyCommand("simulate", "flows.commands.simulate:simulate_command", "Simulate a cluster with the same autoscaling loop a real run uses."),
    LazyCommand("idle-nodes", "flows.commands.idle_nodes:idle_nodes_command", "Replay idle nodes under each policy and report U = A_e / A_s, throughput, rescales and solve times."),
    LazyCommand("retrain", "flows.commands.retrain:retrain", "Retrain one model elastically and log metrics and the model to MLflow."),
    LazyCommand("compare", "flows.commands.compare:compare", "Compare recorded runs (e.g. elastic vs fixed on one trace) and jobs of a running service: table and plot."),
    LazyCommand("ui", "flows.commands.ui:ui", "Print the commands that open the MLflow and Prefect UIs for this project's settings."),
    LazyCommand("hpo", "flows.commands.hpo:app", "Deadline-constrained, cost-minimising plans for successive-halving HPO (seed 001)."),
    LazyCommand("serve", "flows.commands.service:serve", "Run the scheduler service until stopped (Ctrl-C / SIGTERM: running jobs checkpoint, the next service resumes them)."),
    LazyCommand("submit", "flows.commands.submit:submit", "Submit one job (from flags) or a jobs file's jobs to the service; prints the job ids."),
    LazyCommand("jobs", "flows.commands.service:jobs", "The service's jobs: state, GPUs, batch, progress, ETA (with --generations: predicted vs measured samples/s)."),
    LazyCommand("cancel", "flows.commands.service:cancel", "Cancel jobs: a queued one at once, a running one when the service stops it."),
    LazyCommand("wait", "flows.commands.service:wait", "Wait until the jobs end; exit 0 only if all finished."),
)


def _load(entry: LazyCommand) -> click.Command:
    module_name, attribute = entry.target.split(":")
    target = getattr(importlib.import_module(module_name), attribute)
    if isinstance(target, typer.Typer):
        group = typer.main.get_group(target)
        group.name = entry.name
        return group
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command(entry.name)(target)
    return typer.main.get_command(single)


class LazyGroup(TyperGroup):
    """A typer group whose commands are imported on first use.

    ``self.commands`` holds placeholders carrying the one-line help, so the root help and
    "did you mean" suggestions need no imports; ``get_command`` swaps in the real command.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._entries = {entry.name: entry for entry in COMMANDS}
        self._listing = False
        for entry in COMMANDS:
            self.commands[entry.name] = click.Command(entry.name, help=entry.summary, short_help=entry.summary)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = self._entries.get(cmd_name)
        if entry is None or self._listing:
            return self.commands.get(cmd_name)
        command = _load(entry)
        self.commands[cmd_name] = command
        return command

    def invoke(self, ctx: click.Context) -> object:
        # Before the command's module is imported: Prefect and Dask read these at import.
        from flows.commands.shared.console import quiet_libraries

        quiet_libraries(verbose=bool(ctx.params.get("verbose")))
        return super().invoke(ctx)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="malleable",
    cls=LazyGroup,
    help="Elastic deep-learning training: profile, plan, simulate, train and record.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"malleable {version('malleable')}")
        except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
            typer.echo("malleable (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Let Dask, Prefect and MLflow log at INFO (default: errors only).")] = False,
) -> None:
    """Elastic deep-learning training: profile, plan, simulate, train and record."""


def main() -> None:
    try:
        app()
    finally:
        # The command is done and has closed what it opened; what is left goes with the process.
        # Frozen, the start-up's objects (every imported module's) are skipped by the
        # interpreter's last collections at exit: ~0.15 s of CPU of a `malleable jobs`, and of the
        # time a Ctrl-C'd `jobs --watch` takes to end. Only here, where this process is the CLI's
        # own: a test calling ``app`` in its process keeps its collector as it was.
        gc.freeze()


if __name__ == "__main__":
    main()
