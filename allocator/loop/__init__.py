"""The one autoscaling loop (seed 000, Fig. 4), for simulated and real clusters alike.

Jobs arrive into a buffer; every Δ (and, if asked, on each arrival or completion) the loop
takes a snapshot, admits what fits (dropping or queueing the rest), asks the policy for an
allocation and hands the change to an executor. Only the clock and the executor differ
between a simulation (``SimClock`` + ``SimExecutor``) and a real run (a wall clock + the
Dask executor in ``elastic_tasks``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from allocator.loop.driver import run_loop
    from allocator.loop.sources import EPS
    from allocator.loop.types import JobRecord, JobTransition, LoopResult, LoopSettings, ScheduleRow, StepReport

# The run's records are named from here by every layer above.
__all__ = ["EPS", "JobRecord", "JobTransition", "LoopResult", "LoopSettings", "ScheduleRow", "StepReport", "run_loop"]
# Each name is imported on first use: importing any submodule runs this file first, and the job
# store and the CLI need only ``allocator.loop.lifecycle`` (the job states) — not the records'
# trust model (numpy) nor the driver's policies (numpy, pulp), so `malleable jobs` pays for neither.
_HOMES = {"EPS": "sources", "run_loop": "driver", **{n: "types" for n in __all__[1:-1]}}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
