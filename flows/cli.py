"""The ``malleable`` command line: one typer app, one module per command group.

Each command lives in its own ``flows/cmd_*.py`` module exposing a function; this file only
wires them onto the app so that modules stay small and independent.
"""

from __future__ import annotations

import typer

from flows import cmd_service
from flows import cmd_compare, cmd_hpo, cmd_idle_nodes, cmd_plan, cmd_profile, cmd_quickstart, cmd_retrain, cmd_run, cmd_simulate, cmd_train, cmd_ui

app = typer.Typer(
    name="malleable",
    help="Elastic deep-learning training: profile, plan, simulate, train and record.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """Elastic deep-learning training: profile, plan, simulate, train and record."""


app.command("plan")(cmd_plan.plan)
app.command("profile")(cmd_profile.profile_command)
app.command("simulate")(cmd_simulate.simulate_command)
app.command("train")(cmd_train.train)
app.command("idle-nodes")(cmd_idle_nodes.idle_nodes_command)
app.command("ui")(cmd_ui.ui)
app.command("compare")(cmd_compare.compare)
app.command("quickstart")(cmd_quickstart.quickstart)
app.command("run")(cmd_run.run)
app.command("retrain")(cmd_retrain.retrain)
app.add_typer(cmd_hpo.app, name="hpo")
app.command("serve")(cmd_service.serve)
app.command("submit")(cmd_service.submit)
app.command("jobs")(cmd_service.jobs)
app.command("cancel")(cmd_service.cancel)
app.command("wait")(cmd_service.wait)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
