"""Where a job's wall time goes: named phases, the job's split, and how ranks' timelines compose.

Every instant of a job's wall time [submitted, end] goes to the highest-priority phase any of
its ranks was in then (steps first: while one rank trains, the job trains); an instant no rank
covered is *unaccounted* — the figure ``sim_vs_real_bench`` holds to a few per cent. Time
before the first rank began (the executor's start: scheduling the tasks, building the model)
is start; after the last rank returned, waiting (the loop noticing the end); queued is waiting
too. The ranks record their timelines with ``elastic_tasks.rank.accounting.wall_split.WallTimeline``; the
simulator produces the same split from its model (``allocator.simulator``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from enum import Enum


class Phase(str, Enum):
    """Named parts of a job's wall time, in priority order (``job_split``)."""

    STEPS = "steps"
    CHECKPOINT = "checkpoint"
    EVALUATION = "evaluation"
    STATE_TRANSFER = "state_transfer"
    REGROUP = "regroup"
    START = "start"
    WAITING = "waiting"


@dataclass(frozen=True, slots=True)
class PhaseInterval:
    phase: Phase
    start: float  # seconds since the epoch (comparable across a host's processes)
    end: float


@dataclass(frozen=True, slots=True)
class WallSplit:
    """A job's wall time in seconds per named part; ``unaccounted_s`` is what no part covers."""

    wall_s: float
    steps_s: float = 0.0
    checkpoint_s: float = 0.0
    evaluation_s: float = 0.0
    state_transfer_s: float = 0.0
    regroup_s: float = 0.0
    start_s: float = 0.0
    waiting_s: float = 0.0
    unaccounted_s: float = 0.0

    @property
    def unaccounted_pct(self) -> float:
        return 100.0 * self.unaccounted_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {f.name: round(getattr(self, f.name), 4) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: dict) -> WallSplit:
        return cls(**{f.name: float(values.get(f.name, 0.0)) for f in fields(cls)})


def job_split(
    timelines: Iterable[Sequence[PhaseInterval]], start: float, end: float, submitted: float | None = None, launched: float | None = None
) -> WallSplit:
    """The job's split over [``submitted`` or ``start``, ``end``] (see the module's rules).

    ``start``: when the executor started the job (before it: queued, waiting); ``launched``:
    optional, the same as ``start`` unless the executor started it again (a restart) later.
    """
    begin = start if submitted is None else min(submitted, start)
    intervals = [iv for tl in timelines for iv in tl if iv.end > iv.start]
    first = min((iv.start for iv in intervals), default=end)
    last = max((iv.end for iv in intervals), default=end)
    launch = start if launched is None else launched
    extra = (PhaseInterval(Phase.WAITING, begin, start), PhaseInterval(Phase.START, launch, max(first, launch)), PhaseInterval(Phase.WAITING, last, end))
    intervals += [iv for iv in extra if iv.end > iv.start]
    # A sweep over the intervals' ends: how many intervals of each phase are open between two cuts.
    events = sorted((t, delta, iv.phase) for iv in intervals for t, delta in ((max(iv.start, begin), 1), (min(iv.end, end), -1)) if iv.end > begin and iv.start < end)
    open_ = dict.fromkeys(Phase, 0)
    totals = dict.fromkeys(Phase, 0.0)
    covered, t_prev = 0.0, begin
    for t, delta, phase in events:
        if t > t_prev:
            active = [p for p in Phase if open_[p] > 0]  # Phase iterates in priority order
            if active:
                totals[active[0]] += t - t_prev
                covered += t - t_prev
            t_prev = t
        open_[phase] += delta
    wall = end - begin
    return WallSplit(wall, *(totals[p] for p in Phase), unaccounted_s=max(0.0, wall - covered))
