"""The one autoscaling loop (seed 000, Fig. 4), for simulated and real clusters alike.

Jobs arrive into a buffer; every Δ (and, if asked, on each arrival or completion) the loop
takes a snapshot, admits what fits (dropping or queueing the rest), asks the policy for an
allocation and hands the change to an executor. Only the clock and the executor differ
between a simulation (``SimClock`` + ``SimExecutor``) and a real run (a wall clock + the
Dask executor in ``elastic_tasks``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from allocator.loop.sources import EPS
from allocator.loop.types import JobRecord, JobTransition, LoopResult, LoopSettings, ScheduleRow, StepReport

if TYPE_CHECKING:
    from allocator.loop.driver import run_loop

# The run's records are named from here by every layer above.
__all__ = ["EPS", "JobRecord", "JobTransition", "LoopResult", "LoopSettings", "ScheduleRow", "StepReport", "run_loop"]


def __getattr__(name: str):
    # The driver pulls in every policy (numpy, pulp); the job store and the CLI read only the
    # records above, so `malleable jobs` does not pay for the policies at start-up.
    if name == "run_loop":
        from allocator.loop.driver import run_loop

        return run_loop
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
