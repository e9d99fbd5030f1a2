"""How fair the service has been: per team and submitter, GPU-hours used vs entitled and ρ, from the store.

What ``malleable jobs --usage`` shows (``allocator.fairness.report`` defines the figures):

* used: each job's allocation history (GPUs from each row's time on) up to its end, or now;
* entitled: the team's nominal share of ``capacity`` GPUs while its jobs could use it;
* ρ of a finished job: its real JCT (submitted to finished) over its JCT when its team's jobs run
  alone on the team's share — modelled by the simulator with the service's policy and each job's
  own profile (the isolated run never happened), so ρ carries the model's error.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from allocator.fairness.report import FairnessReport, JobSpan, fairness_of, isolated_jcts, loop_isolate
from allocator.fairness.shares import nominal_shares
from allocator.fairness.teams import TeamTable
from allocator.loop import LoopSettings
from allocator.policies import make_policy
from allocator.simulator import simulate
from allocator.types import JobSpec
from service.store import JobStore, submitter_identity
from service.store.records import AllocationRow, JobRow, JobState

# Jobs whose work counts for the isolated run: what ran or waits to run (not what failed or was cancelled).
_COMPETING = (JobState.QUEUED, JobState.RUNNING, JobState.SUSPENDED, JobState.FINISHED)


def held_seconds(history: Sequence[AllocationRow], end: float) -> float:
    """GPU-seconds from an allocation history: each row's GPUs from its time to the next row's (or ``end``)."""
    total = 0.0
    for row, nxt in zip(history, [*history[1:], None]):
        stop = end if nxt is None else min(nxt.time, end)
        total += row.gpus * max(0.0, stop - row.time)
    return total


def peak_gpus(store: JobStore, rows: Sequence[JobRow]) -> int:
    """The most GPUs the service ever gave out at once (a lower bound on its cluster's size)."""
    changes: list[tuple[float, str, int]] = sorted((a.time, r.id, a.gpus) for r in rows for a in store.allocations(r.id))
    held: dict[str, int] = {}
    peak = 0
    for _, job_id, gpus in changes:
        held[job_id] = gpus
        peak = max(peak, sum(held.values()))
    return peak


def service_usage(store: JobStore, teams: TeamTable, capacity: int, policy: str, interval_s: float, now: float | None = None) -> FairnessReport:
    now = time.time() if now is None else now
    rows = store.jobs()
    t0 = min((r.submitted_at for r in rows), default=now)
    spans, used, specs = [], {}, []
    for r in rows:
        team = teams.team_of_submitter(submitter_identity(r.submitter))
        try:
            spec = r.job_spec()
        except ValueError:
            continue  # a row the feed fails too (edited by hand): not a job that shared anything
        end = r.finished_at if r.finished_at is not None else (r.updated_at if r.state.terminal else now)
        most = min(capacity, spec.max_gpus if spec.elastic else spec.requested_gpus)
        jct = r.finished_at - r.submitted_at if r.state is JobState.FINISHED and r.finished_at is not None else None
        spans.append(JobSpan(r.id, team, submitter_identity(r.submitter), r.submitted_at, end, most, jct))
        used[r.id] = held_seconds(store.allocations(r.id), end)
        if r.state in _COMPETING:
            # Arriving when it was submitted, on the isolated run's clock; in its team as the service placed it.
            specs.append(dataclasses.replace(spec, arrival_time=r.submitted_at - t0, team=team, submitter=r.submitter))
    settings = LoopSettings(interval_s=interval_s)
    isolate = loop_isolate(lambda jobs, gpus: simulate(jobs, make_policy(policy), gpus, settings))
    nominal = nominal_shares(teams, capacity, [*teams.names(specs), *(s.team for s in spans)])
    return fairness_of(spans, used, nominal, isolated_jcts(specs, teams, capacity, isolate))
