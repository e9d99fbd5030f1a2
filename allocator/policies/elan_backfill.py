"""Seed 002 (Elan) E-BF: EASY backfilling around a reservation for the queue's head, plus
Elan's elastic allocation rule (shared with ``elan_fifo``).

What the paper says: BF is Slurm's default, "based on FIFO but allows low priority jobs to
start earlier if doing so will not delay high priority jobs to start"; E-BF adds Elan's
admission and allocation rules (see ``elan_fifo``).

What we do (EASY backfilling, the usual reading of Slurm's backfill):

* Jobs start in arrival order while they can (same start condition as E-FIFO, including
  the optional ``jct_rule``).
* The first job that cannot start — the head — gets a reservation: its *shadow time* is
  when enough running jobs will have finished for the minimums (its own included) to fit,
  predicted from each job's remaining samples at the throughput the allocation rule gives
  it now. GPUs left over at the shadow time beyond the head's minimum are *extra*.
* A later job may start now (backfill) if it passes the E-FIFO start condition and either
  it finishes before the shadow time even if held at its minimum GPUs (a pessimistic
  estimate) or its minimum fits into the extra GPUs (which it then uses up). So it never
  holds GPUs the head is promised.
* Only the head is protected (EASY, not conservative backfilling); other waiting jobs may
  be overtaken. A head that can never fit on the cluster reserves nothing.
* In DROP mode nothing waits, so there is no head to protect: E-BF admits exactly what
  E-FIFO admits.

Allocation among admitted jobs is E-FIFO's (Elan's marginal-gain rule); only admission differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from allocator.policies.base import register
from allocator.policies.elan_fifo import Admitting, ElanFifo, check_params, decision, is_drop, parse_flag
from allocator.policies.elastic_dp import job_table
from allocator.protocols import AdmissionDecision, OverflowMode
from allocator.types import Allocation, ClusterSnapshot, JobSpec



@dataclass(frozen=True, slots=True)
class Reservation:
    """The head's promise: from ``shadow_s`` seconds on it gets its minimum; ``extra`` GPUs are spare then."""

    job_id: str
    shadow_s: float
    extra: int


def reserve(state: Admitting, head: JobSpec) -> Reservation | None:
    """Shadow time and extra GPUs for ``head`` given the jobs accepted so far (None: it can never fit)."""
    need = state.minimum(head)
    capacity = state.snapshot.capacity
    if need is None or need > capacity or state.need > capacity:
        return None  # it can never fit, or the running jobs alone overfill the cluster: nothing starts anyway
    held = state.need
    shadow = 0.0
    for finish_s, minimum in sorted(state.predicted_finishes()):
        if held + need <= capacity:
            break
        held -= minimum
        shadow = finish_s
    return Reservation(head.id, shadow, capacity - held - need)


def finish_at_minimum_s(job: JobSpec, gpus: int) -> float:
    """Seconds the whole job takes if held at ``gpus`` GPUs — an upper bound under the allocation rule."""
    rate = float(job_table(job, gpus, None).rates[gpus])
    return job.total_samples / rate if rate > 0 and math.isfinite(rate) else math.inf


@dataclass(frozen=True, slots=True)
class ElanBackfill:
    jct_rule: bool = False
    name: str = "elan_backfill"

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        return ElanFifo(self.jct_rule).allocate(snapshot)

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None:
        return ElanFifo(self.jct_rule).min_gpus(job, capacity)

    def admit(self, snapshot: ClusterSnapshot, mode: OverflowMode) -> AdmissionDecision:
        """Arrival order while jobs can start; after the first that cannot, backfill around its reservation."""
        if is_drop(mode):
            return ElanFifo(self.jct_rule).admit(snapshot, mode)
        state = Admitting.start(snapshot, self, self.jct_rule)
        admitted: list[JobSpec] = []
        waiting: list[JobSpec] = []
        reservation: Reservation | None = None
        for job in snapshot.queued:
            startable = state.fits(job) and state.worth_starting(job)
            if not waiting:
                if startable:
                    state.take(job)
                    admitted.append(job)
                else:
                    waiting.append(job)
                    reservation = reserve(state, job)
                continue
            if startable and reservation is None:
                state.take(job)  # the head can never run: nobody to protect
                admitted.append(job)
                continue
            need = state.minimum(job) or 0
            if startable and finish_at_minimum_s(job, need) <= reservation.shadow_s:  # type: ignore[union-attr]
                state.take(job)
                admitted.append(job)
            elif startable and need <= reservation.extra:  # type: ignore[union-attr]
                reservation = Reservation(reservation.job_id, reservation.shadow_s, reservation.extra - need)  # type: ignore[union-attr]
                state.take(job)
                admitted.append(job)
            else:
                waiting.append(job)
        return decision(admitted, waiting, [])


@register("elan_backfill")
def _make(jct_rule: object = False, **params: object) -> ElanBackfill:
    check_params("elan_backfill", params)
    return ElanBackfill(jct_rule=parse_flag("jct_rule", jct_rule))
