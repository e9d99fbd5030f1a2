"""A simulated job's wall time, split into the parts a real job's record names (``allocator.wall_split``).

From the loop's result and the costs the run charged (``RescaleCost``): queued until its start
is waiting; the start cost is start; each in-place, batch-only or restart event's lost seconds
are regroup; the rest of each generation is its steps and its checkpoint writes, in the ratio
the model gives them (a write's seconds spread over the steps between two writes, as
``SimExecutor`` runs them). Only throughput physics is split this way (its executor charges
these costs); the simulator has no evaluation or state transfer of its own: a calibrated start
cost holds what a real job pays once for them.
"""

from __future__ import annotations

from collections.abc import Mapping

from allocator.loop import LoopResult
from allocator.simulator.executor import RescaleCost
from allocator.physics.throughput import throughput
from allocator.types import JobSpec, RescaleKind
from allocator.wall_split import WallSplit

_REGROUP = (RescaleKind.IN_PLACE, RescaleKind.BATCH, RescaleKind.RESTART)


def simulated_splits(result: LoopResult, jobs: Mapping[str, JobSpec], cost: RescaleCost) -> dict[str, WallSplit]:
    """Per finished job: its split over [arrival, finish]."""
    out: dict[str, WallSplit] = {}
    c = cost.checkpoint_per_step_s
    for rec in result.jobs:
        if rec.start is None or rec.finish is None or rec.job_id not in jobs:
            continue
        spec = jobs[rec.job_id]
        rows = sorted((r for r in result.schedule if r.job_id == rec.job_id), key=lambda r: r.time)
        lost = {e.time: e.cost_s or 0.0 for e in result.events if e.job_id == rec.job_id and e.kind in (*_REGROUP, RescaleKind.START)}
        start_s = regroup_s = steps_s = checkpoint_s = 0.0
        for i, row in enumerate(rows):
            end = rows[i + 1].time if i + 1 < len(rows) else rec.finish
            if row.gpus == 0 or end <= row.time:
                continue
            pause = min(lost.get(row.time, 0.0), end - row.time)
            if row.time == rec.start:
                start_s += pause
            else:
                regroup_s += pause
            active = end - row.time - pause
            rate = throughput(spec.profile, row.batch, row.gpus, row.accum_steps)
            share = c / (row.batch / rate + c) if c > 0 and rate > 0 else 0.0
            checkpoint_s += active * share
            steps_s += active * (1 - share)
        wall = rec.finish - rec.arrival
        waiting = rec.start - rec.arrival
        named = waiting + start_s + regroup_s + steps_s + checkpoint_s
        out[rec.job_id] = WallSplit(
            wall, steps_s=steps_s, checkpoint_s=checkpoint_s, regroup_s=regroup_s, start_s=start_s, waiting_s=waiting, unaccounted_s=max(0.0, wall - named)
        )
    return out
