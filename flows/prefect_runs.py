"""Whether a command records its flow run in Prefect, and the flow's steps as plain calls when not.

Prefect's ephemeral API (no ``PREFECT_API_URL``) is a server process started on demand: about
8 s on an idle 2-core machine, for a `run --simulate` whose work takes 1.6 s, and its record
lands in ``$PREFECT_HOME`` where no UI looks until one is started there. So short commands
record a flow run only where a Prefect API is configured (``MALLEABLE_PREFECT_RUNS=auto``, the
default), always (``always``: the ephemeral API as before) or never (``never``). Not recorded,
the flow's function runs as it is, its tasks as plain functions, and Prefect artifacts (which
belong to a flow run) are left out; MLflow records the run either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MODES = ("auto", "always", "never")


def record_in_prefect(mode: str) -> bool:
    """Whether a flow should run as a Prefect flow run under ``mode`` (one of ``MODES``)."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value())  # a server or Prefect Cloud, from the environment or the profile


def in_flow_run() -> bool:
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


def step(task: Any) -> Callable[..., Any]:
    """``task`` inside a flow run (a task run, retries and all); its plain function outside one."""
    return task if in_flow_run() else task.fn


def run_flow(flow: Any, record: bool, *args: Any, **kwargs: Any) -> Any:
    """``flow(*args, **kwargs)`` as a Prefect flow run when ``record``, else its plain function."""
    return flow(*args, **kwargs) if record else flow.fn(*args, **kwargs)
