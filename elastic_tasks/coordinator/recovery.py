"""Worker loss: a generation lost ranks; the survivors continue, or new ranks resume from the checkpoint.

A rank whose collective fails reports the step it holds and waits. Once every member of the
failed generation has reported or is known dead, the survivors form the next generation,
copying the state of the survivor furthest ahead. If nobody survived, new ranks load the
last checkpoint; without one the job fails. The members declared lost are fenced first
(``JobBoard.fence``): whatever they write later — a frozen host thawed, a cut link back — the
scheduler refuses, and their results are left out of the job's. When every rank dies at once nobody reports: the
scheduler's view of the workers is then the only witness, checked on every pump tick.

On nccl a dead peer does not make the survivors' collective fail: it hangs. So the same
check tells the ranks (``JobBoard.abort_generation``) as soon as one member of the running
generation is dead; each rank's ``HangWatch`` then aborts its communicator and the survivors
report as they would on gloo (rank/health/hang_watch.py, docs/elastic.md "Two planes"). A
recovery says the same as it begins: on gloo too a survivor can sit in a collective on a live
peer that has already left it to report (only the dead rank's neighbours raise at once).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from elastic_tasks.board import EventKind, RankEvent
from elastic_tasks.coordinator.lifecycle import CoordinatorState
from elastic_tasks.protocol import FROM_CHECKPOINT, Plan, PlanKind
from elastic_tasks.rank.state.checkpoint_files import has_checkpoint

if TYPE_CHECKING:
    from elastic_tasks.coordinator.job import JobCoordinator

log = logging.getLogger(__name__)

# The failed generation's plan is ours and already published: this only rides out a slow scheduler.
PLAN_READ_S = 5.0
# Survivors report within one collective timeout of the failure (a hung peer's collective
# times out after ``timeout_s``); this much more lets their reports travel to the scheduler.
# Where a report says its rank already sat a control timeout in the failed collective (a silent
# peer: link cut, frozen host), every live member was in that collective too and reports within
# this grace of the first report; the silent one has had its control timeout: no second one.
REPORT_GRACE_S = 5.0
# A worker heard from within this is alive (Dask's heartbeats come every ~0.5-1 s on a small
# cluster; a loaded host's may be late by seconds); asked at most every HEARTBEAT_ASK_S.
HEARTBEAT_FRESH_S = 3.0
HEARTBEAT_ASK_S = 0.5
# Asking the scheduler whether every member's worker died is a round trip: twice a second.
ALL_DEAD_CHECK_S = 0.5
# Nannies restart killed workers under new addresses: how often to look for one.
NANNY_POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class RecoveryRecord:
    failed_version: int
    version: int
    survivors: tuple[str, ...]
    lost: tuple[str, ...]
    resumed_step: int
    last_reported_step: int
    pause_s: float | None  # measured by the new generation's rank 0; None: it never trained
    from_checkpoint: bool

    @property
    def steps_lost(self) -> int:
        """Completed steps thrown away (the partial step in flight is redone on top)."""
        return max(0, self.last_reported_step - self.resumed_step)


class Recovery:
    """Runs on the job's event pump; ``records`` lists every recovery so far."""

    def __init__(self, job: JobCoordinator) -> None:
        self.job = job
        self.records: list[RecoveryRecord] = []
        self._next_check = 0.0
        self._signalled: set[int] = set()  # generations the ranks were told lost a member
        self.fenced: set[str] = set()  # ranks declared lost: the job takes nothing more from them
        # The newest recovery's generation until it is heard to start: then the job is RUNNING again
        # and its record gets the step it resumed at and the pause (``_settle``).
        self._unsettled: int | None = None

    def recovered_from(self) -> set[int]:
        return {r.failed_version for r in self.records}

    def successor(self, version: int) -> int:
        """The generation that now stands for ``version``: itself, or the recovery (of a recovery, ...)
        that replaced it, e.g. when a member never reached its rendezvous."""
        for record in list(self.records):  # in order: a chain of recoveries is followed to its end
            if record.failed_version == version:
                version = record.version
        return version

    def tick(self) -> None:
        """After each drain: recover the newest failed generation not yet recovered."""
        heard = self.job.pump.heard
        self._settle()
        done = self.recovered_from()
        newest_applied = max(heard.applied, default=-1)
        for version in sorted(heard.failed):
            if version not in done and version >= newest_applied:
                self.recover(version)
                return
        if time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + ALL_DEAD_CHECK_S
            self._signal_lost_member()
            self._check_all_dead(newest_applied)

    def _settle(self) -> None:
        """The newest recovery's generation started: the job trains again, so it is RUNNING, and its
        record gets the step it resumed at and the pause its rank 0 measured (the survivors time it
        from the moment their collective failed). Heard during the recovery's wait or after it: a
        job whose relaunched ranks took longer than the wait (seen on CI's loaded box) reported
        RECOVERING until it ended, its record a resumed step of -1."""
        job = self.job
        if self._unsettled is None or not self.records or self.records[-1].version != self._unsettled:
            return
        applied = job.pump.heard.applied.get(self._unsettled)
        if applied is None:
            return
        record = self.records[-1]
        self.records[-1] = replace(record, resumed_step=applied.step if record.resumed_step < 0 else record.resumed_step, pause_s=applied.pause_s)
        self._unsettled = None
        job.lifecycle.move(CoordinatorState.RUNNING, only_from=(CoordinatorState.RECOVERING,))

    def _signal_lost_member(self) -> None:
        """A member of the running generation is dead: free the survivors from the collective
        it leaves hanging on nccl (on gloo it has raised already; the word is then moot)."""
        job = self.job
        version = job.version
        if version < 0 or version in self._signalled or job.state not in (CoordinatorState.RUNNING, CoordinatorState.RESCALING):
            return
        if any(job.dead(u) for u in job.members):
            self._tell_ranks_generation_over(version)

    def _tell_ranks_generation_over(self, version: int) -> None:
        """Say on the board that generation ``version`` is over (once; never for one older than
        already said: the board keeps the newest)."""
        if version in self._signalled or version < max(self._signalled, default=-1):
            return
        self._signalled.add(version)
        self.job.board.abort_generation(version)

    def _check_all_dead(self, version: int) -> None:
        job = self.job
        members = job.members
        if version < 0 or job.finished or not members or version in self.recovered_from():
            return
        if version != job.version or not all(job.dead(u) for u in members):
            return
        job.pump.mark_failed(version)
        self.recover(version)

    def recover(self, failed_version: int) -> None:
        """Every member of the failed generation reported or is dead (or time is up): regroup."""
        job, pump = self.job, self.job.pump
        with job.plan_lock:
            if failed_version in self.recovered_from():
                return
            self._unsettled = None  # a generation that failed before it started: this recovery replaces it
            job.lifecycle.move(CoordinatorState.RECOVERING)
            # Over for every member: one blocked in its collective on a live peer (gloo raises only
            # beside the dead rank, nccl nowhere; that peer has left to report) is freed by its hang
            # watch now, and reports, rather than waiting out a timeout that would count it lost.
            self._tell_ranks_generation_over(failed_version)
            members = job.board.plan(failed_version, timeout=PLAN_READ_S).members
            t0 = time.monotonic()
            silent = _SilentMembers(job, members, failed_version)
            while time.monotonic() < report_deadline(t0, job.config.timeout_s, pump.heard.blocked.get(failed_version, 0.0), silent.heard_of()):
                reported = pump.heard.failed.get(failed_version, {})
                if all(u in reported or job.dead(u) for u in members):
                    break
                pump.pump()
            reported = dict(pump.heard.failed.get(failed_version, {}))
            survivors = tuple(u for u in members if u in reported and not job.dead(u))
            lost = tuple(u for u in members if u not in survivors)
            why = "; ".join(why_lost(job, u) for u in lost)  # before drop(): it cancels their tasks
            # Before anything else changes: whatever a lost rank writes from now on (a frozen host
            # thawed, a cut link back) the scheduler refuses (board.JobBoard.fence).
            job.board.fence(lost, failed_version)
            self.fenced.update(lost)
            job.drop(lost)
            last_status = job.status()
            last_step = max([*reported.values(), last_status.step if last_status else 0])
            version = job.next_version()
            if survivors:
                source = max(survivors, key=lambda u: (reported[u], -members.index(u)))
                new_plan = Plan(version, PlanKind.RECOVER, survivors, max(job.global_batch, len(survivors)), source=source)
                resumed = reported[source]
            elif has_checkpoint(job.config.checkpoint_dir):
                survivors = self._relaunch(len(members), version)
                new_plan = Plan(version, PlanKind.RECOVER, survivors, max(job.global_batch, len(survivors)), source=FROM_CHECKPOINT)
                resumed = -1
            else:
                pump.record(RankEvent(EventKind.ERROR, "-", failed_version, last_step, detail="every rank was lost and no checkpoint exists"))
                job.lifecycle.move(CoordinatorState.FAILED)
                self.records.append(RecoveryRecord(failed_version, version, (), lost, -1, last_step, None, False))
                return
            if new_plan.source == FROM_CHECKPOINT:
                log.warning(
                    "job %s: generation %d lost every rank (%s); %d new rank(s) resume from the last checkpoint",
                    job.job_id, failed_version, why, len(survivors),
                )  # fmt: skip
            else:
                log.warning("job %s: generation %d lost %s; %d survivor(s) continue", job.job_id, failed_version, why, len(survivors))
            job.publish(new_plan)
            job.members, job.global_batch, job.accum_steps = new_plan.members, new_plan.global_batch, new_plan.accum_steps
            record = RecoveryRecord(failed_version, version, survivors, lost, resumed, last_step, None, new_plan.source == FROM_CHECKPOINT)
            self.records.append(record)
        # Wait for the new generation here (the pump must keep pumping events meanwhile). One that
        # starts later is settled when it is heard (``tick``), however long after this wait.
        self._unsettled = version
        deadline = time.monotonic() + job.startup_s
        while time.monotonic() < deadline and version not in pump.heard.applied and not job.finished:
            pump.pump()
        self._settle()

    def _relaunch(self, wanted: int, version: int) -> tuple[str, ...]:
        """New ranks for a generation that lost every rank, on whatever workers the nannies bring back."""
        job = self.job
        wait_until = time.monotonic() + job.startup_s
        while not job.pool.free() and time.monotonic() < wait_until:
            time.sleep(NANNY_POLL_S)
        workers = job.pool.take(job.job_id, max(1, min(wanted, len(job.pool.free()))))
        return tuple(job.launch(addr, version) for addr in workers)


def report_deadline(t0: float, timeout_s: float, blocked_s: float, silent_heard_of: bool = False) -> float:
    """Until when recovery (begun at ``t0``) waits for the failed generation's members to report.

    ``blocked_s``: the longest any report says its rank sat in the failed collective. Once that
    reaches the control timeout, the member that never answered has had its timeout; the rest
    report within ``REPORT_GRACE_S`` — unless a member yet to report is on a worker the scheduler
    still hears from (``silent_heard_of``: a loaded host, slow to notice its own collective
    failed, not a cut or frozen one). Otherwise a member may still be blocked in the collective
    for up to a control timeout before it reports (the longer wait)."""
    if blocked_s >= timeout_s and not silent_heard_of:
        return t0 + REPORT_GRACE_S
    return t0 + timeout_s + REPORT_GRACE_S


class _SilentMembers:
    """Whether a member yet to report runs on a worker that still heartbeats (asked at most every
    ``HEARTBEAT_ASK_S``). A cut or frozen host's worker falls silent at the fault; a loaded one
    keeps beating, and its rank reports, late."""

    def __init__(self, job: JobCoordinator, members: tuple[str, ...], version: int) -> None:
        self.job, self.members, self.version = job, members, version
        self._asked, self._answer = -HEARTBEAT_ASK_S, False

    def heard_of(self) -> bool:
        now = time.monotonic()
        if now - self._asked < HEARTBEAT_ASK_S:
            return self._answer
        self._asked = now
        reported = self.job.pump.heard.failed.get(self.version, {})
        workers = [w for u in self.members if u not in reported and not self.job.dead(u) and (w := self.job.worker_of.get(u))]
        try:
            ages = self.job.pool.heartbeat_ages(workers) if workers else {}
        except Exception:  # noqa: BLE001 - no answer from the scheduler: decide as if none beats
            ages = {}
        self._answer = any(age < HEARTBEAT_FRESH_S for age in ages.values())
        return self._answer


def why_lost(job: JobCoordinator, uid: str) -> str:
    """What the coordinator saw of a rank it gave up: its task's end, or its worker leaving (a
    rank that never said why is otherwise a mystery in the log)."""
    fut = job.futures.get(uid)
    if fut is not None and fut.status == "error":
        try:
            exc = fut.exception(timeout=1)
        except Exception as err:  # noqa: BLE001 - only a diagnosis
            exc = err
        return f"{uid}: its task raised {type(exc).__name__}: {exc}"
    if fut is not None and fut.status in ("cancelled", "lost"):
        return f"{uid}: its task was {fut.status}"
    worker = job.worker_of.get(uid)
    if worker not in set(job.pool.alive()):
        return f"{uid}: its worker {worker} left the cluster"
    return f"{uid}: reported nothing within the collective timeout"
