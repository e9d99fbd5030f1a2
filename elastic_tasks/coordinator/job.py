"""Drives one job's ranks through Dask: launch, rescale in place, restart, stop.

The coordinator lives with the Dask client. It publishes numbered plans on the job board;
its event pump (``event_pump``) hears the ranks' events, and ``recovery`` regroups a
generation that lost ranks. A scale-out first launches the new ranks and lets them build
their model *while the job keeps training*; only when all report ready is the plan
published, so the job pauses just for the regroup and the state copy (seed 002's
asynchronous coordination). ``state`` says where the job is in its lifecycle (``job_state``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from distributed import Client, Future

from elastic_tasks.board import EventKind, JobBoard, JobStatus, RankEvent
from elastic_tasks.cluster import WorkerPool
from elastic_tasks.devices import GPU_RESOURCE
from elastic_tasks.coordinator.batch_change import change_batch
from elastic_tasks.coordinator.event_pump import EventPump, Heard
from elastic_tasks.coordinator.lifecycle import CoordinatorState, Lifecycle
from elastic_tasks.coordinator.outcomes import JobFailed, JobResult, RescaleOutcome, gather, occupancy
from elastic_tasks.protocol import FROM_CHECKPOINT, Plan, PlanKind, RankResult, RankSpec, TrainConfig, check_batch
from elastic_tasks.coordinator.recovery import Recovery, RecoveryRecord
from elastic_tasks.coordinator.restart import restart_rescale
from elastic_tasks.rank.state.checkpoint_files import has_checkpoint
from elastic_tasks.coordinator.timeouts import startup_s, suspend_s
from elastic_tasks.rank.task import build_recipe, run_rank

log = logging.getLogger(__name__)

# A plan for a future step waits for the job to get there: bounded by the job's length, not us.
FUTURE_STEP_WAIT_S = 3600.0


@dataclass(frozen=True, slots=True)
class _Pending:
    plan: Plan
    before: tuple[str, ...]
    prepare_s: float


class JobCoordinator:
    def __init__(
        self,
        client: Client,
        pool: WorkerPool,
        job_id: str,
        entrypoint: str,
        config: TrainConfig,
        *,
        delays: dict[int, float] | None = None,
        on_straggler: Callable[[str, int], None] | None = None,
        remove_stragglers: bool = False,
        build_recipe_here: bool = True,
    ) -> None:
        if build_recipe_here:  # a broken recipe fails here, before any rank task exists (see build_recipe)
            build_recipe(entrypoint)
        self.client, self.pool, self.job_id, self.entrypoint, self.config = client, pool, job_id, entrypoint, config
        # Scheduler-side state (plans, events, "started" marks, task keys) outlives a run on a
        # long-lived scheduler: a fresh token keeps a re-run of this job id from reading it.
        self.board_id = f"{job_id}.{uuid.uuid4().hex[:8]}"
        self.board = JobBoard(self.board_id, client)
        self.board.serve_fenced_writes()  # before any rank writes (board.WRITE_HANDLER)
        self.delays = dict(delays or {})  # launch order -> injected seconds per step
        self.on_straggler, self.remove_stragglers = on_straggler, remove_stragglers
        self.members: tuple[str, ...] = ()
        self.worker_of: dict[str, str] = {}
        self.futures: dict[str, Future] = {}
        self.version = -1
        self.global_batch, self.accum_steps = config.global_batch, None  # accumulation None: the ranks' own rule
        self.rescales: list[RescaleOutcome] = []
        self.removed_stragglers: list[tuple[int, str]] = []
        self.lifecycle = Lifecycle()
        self.plan_lock = threading.RLock()  # one plan change at a time (caller's thread or recovery)
        self.recovery = Recovery(self)
        self.pump = EventPump(self.board, job_id, on_event=self._heard, on_tick=self.recovery.tick)
        self.startup_s = startup_s(config)
        self._counter = itertools.count()
        self._status: JobStatus | None = None
        self._stopping: tuple[str, ...] = ()
        self._results: dict[str, RankResult] = {}

    # -- public API ----------------------------------------------------------------------------

    @property
    def state(self) -> CoordinatorState:
        return self.lifecycle.state

    @property
    def world_size(self) -> int:
        return len(self.members)

    @property
    def recoveries(self) -> list[RecoveryRecord]:
        return self.recovery.records

    @property
    def finished(self) -> bool:
        return self.pump.heard.finished is not None

    def start(self, gpus: int, global_batch: int | None = None, accum_steps: int | None = None) -> RescaleOutcome:
        """``accum_steps``: the policy's; None: the smallest that fits ``max_batch_per_gpu``."""
        batch = self.config.global_batch if global_batch is None else global_batch
        check_batch(batch, gpus)
        workers = self.pool.take(self.job_id, gpus)
        # A job whose checkpoint directory holds its state (a service restarted after a crash or
        # a shutdown) resumes from it rather than starting over.
        source_of = FROM_CHECKPOINT if has_checkpoint(self.config.checkpoint_dir) else None
        with self.plan_lock:
            self.lifecycle.move(CoordinatorState.STARTING)
            version = self.next_version()
            uids = [self.launch(addr, version) for addr in workers]
            t0 = time.time()
            self.publish(Plan(version, PlanKind.START, tuple(uids), batch, source=source_of or uids[0], accum_steps=accum_steps))
            self.members, self.global_batch, self.accum_steps = tuple(uids), batch, accum_steps
        self.pump.start()
        event = self.wait_applied(version, self.startup_s)
        if event is None and not self.finished:
            raise self.fail(f"its {gpus} rank(s) did not start within {self.startup_s:g} s; {occupancy(self.client, list(workers))}")
        self.lifecycle.move(CoordinatorState.RUNNING, only_from=(CoordinatorState.STARTING,))
        world = event.world_size if event is not None and event.world_size else gpus  # fewer: a recovery replaced it
        outcome = RescaleOutcome(version, PlanKind.START, 0, world, batch, event.step if event else 0, event.pause_s if event else None, time.time() - t0)
        self.rescales.append(outcome)
        return outcome

    def rescale(self, gpus: int, global_batch: int | None = None, at_step: int | None = None, accum_steps: int | None = None) -> RescaleOutcome | None:
        """Grow or shrink in place, or change batch/accumulation alone; blocks until the job trains
        on it. None if the job ended first. A shrink keeps the longest-running ranks (rank 0 first)."""
        batch = self.global_batch if global_batch is None else global_batch
        check_batch(batch, gpus)
        if gpus == len(self.members):
            return change_batch(self, batch, at_step, accum_steps)  # the same ranks: no regroup
        with self.plan_lock:
            before = self.members
            keep = before[:gpus]
            added = self.pool.take(self.job_id, gpus - len(keep)) if gpus > len(keep) else []
            pending = self._publish_regroup(before, keep, added, batch, at_step, accum_steps)
        return self._await_regroup(pending)

    def replace(self, uid: str, at_step: int | None = None) -> RescaleOutcome | None:
        """Take rank ``uid`` out (a straggler); a free worker, if any, replaces it in the same switch."""
        with self.plan_lock:
            before = self.members
            free = self.pool.free()
            if uid not in before or (len(before) == 1 and not free):
                return None
            keep = tuple(u for u in before if u != uid)
            added = self.pool.take(self.job_id, 1) if free else []
            pending = self._publish_regroup(before, keep, added, max(self.global_batch, len(keep) + len(added)), at_step, None)
        return self._await_regroup(pending)

    def restart_rescale(self, gpus: int, global_batch: int | None = None, at_step: int | None = None, restart_processes: bool = True) -> RescaleOutcome | None:
        """The checkpoint-restart path (``elastic_tasks.coordinator.restart``): save, stop every rank (and its process), start anew from disk."""
        return restart_rescale(self, gpus, global_batch, at_step, restart_processes)

    def stop(self, checkpoint: bool = False) -> None:
        """Every rank leaves at its next step; with ``checkpoint`` (and a checkpoint directory) rank 0
        saves first, so that a later ``start`` resumes where it stopped (a preempted job)."""
        kind = PlanKind.CHECKPOINT_STOP if checkpoint and self.config.checkpoint_dir is not None else PlanKind.STOP
        with self.plan_lock:
            if not self.finished and self.members:
                self.publish(Plan(self.next_version(), kind, (), self.global_batch))
            self._stopping, self.members = self.members, ()
            self.lifecycle.move(CoordinatorState.STOPPED)

    def suspend(self, timeout: float | None = None) -> bool:
        """Checkpoint and stop every rank (a service shutting down); True once rank 0 saved.

        The job's workers are free afterwards; a later ``start`` resumes from the checkpoint.
        """
        if self.config.checkpoint_dir is None:
            raise ValueError("checkpoint_dir=None: suspending a job needs a checkpoint directory")
        wait_s = suspend_s(self.config) if timeout is None else timeout
        with self.plan_lock:
            if self.finished or not self.members:
                return False
            self.lifecycle.move(CoordinatorState.SUSPENDING)
            version = self.next_version()
            self.publish(Plan(version, PlanKind.CHECKPOINT_STOP, (), self.global_batch))
            self._stopping, self.members = self.members, ()
        stopping = self._stopping
        # Workers killed with the service (Ctrl-C reaches a terminal's whole process group) never
        # answer: stop waiting once all of them are gone.
        stopped = self.wait_for(lambda h: h.stopped.get(version) or h.finished or all(self.dead(u) for u in stopping), wait_s)
        # Shutting down: the ranks' results are not needed, and a rank whose worker died with the
        # service would hold a wait for its result until the start-up timeout.
        self.abandon()
        return isinstance(stopped, RankEvent) and stopped.kind == EventKind.STOPPED

    def failure(self) -> str | None:
        """Why the job cannot go on, if it cannot (without raising)."""
        try:
            self._raise_errors()
        except JobFailed as exc:
            return str(exc)
        return None

    def abandon(self) -> None:
        """Give up on a failed job: stop what still runs, cancel its rank tasks, free its workers."""
        with contextlib.suppress(Exception):
            self.stop()
        for fut in self.futures.values():
            with contextlib.suppress(Exception):
                fut.cancel()
        self.close()
        self.pool.give_back(self.worker_of.values(), owner=self.job_id)

    def status(self) -> JobStatus | None:
        status = self.board.status()
        # The board refuses a fenced rank's status; one it published before it was declared lost
        # stays until the next generation's rank 0 publishes: not the job's progress either.
        if status is not None and status.writer not in self.recovery.fenced:
            self._status = status
        return self._status

    def wait(self, timeout: float | None = None) -> JobResult:
        """Block until the job finishes (or stops); gather every rank's result."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_errors()
            if self.finished or not self.members:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id}: not finished within {timeout:g} s")
            self.pump.nap()
        return self.collect()

    def collect(self) -> JobResult:
        for uid, fut in self.futures.items():
            if uid in (*self.members, *self._stopping) and fut.status == "pending":
                # Rank 0 announces the end just before its task returns: wait for the members.
                fut.result(timeout=self.startup_s)
        self.harvest()
        for fut in self.futures.values():
            if fut.status != "error":
                fut.cancel()  # joiners of a plan the job never reached
        results = list(self._results.values())
        self.close()
        self.pool.give_back(self.worker_of.values(), owner=self.job_id)
        return gather(self.job_id, self.finished, results, self.rescales, self.recoveries, self.pump.heard.stragglers, frozenset(self.recovery.fenced))

    def close(self) -> None:
        self.pump.close()

    # -- for recovery and the restart path ----------------------------------------------------

    def next_version(self) -> int:
        latest = self.board.latest_version()
        self.version = max(self.version, -1 if latest is None else latest) + 1
        return self.version

    def publish(self, plan: Plan) -> None:
        self.board.publish(plan)

    def launch(self, worker: str, version: int) -> str:
        n = next(self._counter)
        uid = f"{self.job_id}-r{n}"
        spec = RankSpec(self.board_id, uid, self.entrypoint, self.config, version, delay_s=self.delays.get(n, 0.0))
        self.worker_of[uid] = worker
        self.futures[uid] = self.client.submit(
            run_rank, spec, key=f"malleable-rank-{self.board_id}-r{n}", workers=[worker], allow_other_workers=False, resources={GPU_RESOURCE: 1}, pure=False
        )
        return uid

    def drop(self, uids: Iterable[str]) -> None:
        """Lost ranks: cancel their tasks, free their workers."""
        for uid in uids:
            fut = self.futures.get(uid)
            if fut is not None:
                fut.cancel()
            self.pool.give_back([self.worker_of[uid]])

    def dead(self, uid: str) -> bool:
        fut = self.futures.get(uid)
        if fut is not None and fut.status in ("error", "cancelled", "lost"):
            return True
        return self.worker_of.get(uid) not in set(self.pool.alive())

    def eta_s(self, at_step: int | None) -> float:
        if at_step is None:
            return 0.0
        status = self.status()
        if status is None or at_step <= status.step:
            return 0.0
        return FUTURE_STEP_WAIT_S

    def wait_for(self, predicate: Callable[[Heard], object], timeout: float) -> object | None:
        value = self.pump.wait_for(predicate, timeout)
        if not value and self.pump.heard.errors:
            self._raise_errors()
        return value

    def wait_applied(self, version: int, timeout: float) -> RankEvent | None:
        """Rank 0's word that ``version`` (or the recovery that replaced it: the event says) trains."""
        def applied(h: Heard) -> object:
            return h.applied.get(self.recovery.successor(version)) or ("finished" if h.finished else None)

        value = self.wait_for(applied, timeout)
        return value if isinstance(value, RankEvent) else None

    def fail(self, why: str) -> JobFailed:
        self.lifecycle.move(CoordinatorState.FAILED)
        return JobFailed(f"job {self.job_id}: {why}")

    def harvest(self) -> None:
        """Move finished ranks' results into the coordinator and release their futures."""
        for uid, fut in list(self.futures.items()):
            if fut.status == "finished":
                if uid not in self.recovery.fenced:  # a rank declared lost: what it returns is not the job's
                    self._results[uid] = fut.result()
                fut.release()
                del self.futures[uid]

    # -- internals -----------------------------------------------------------------------------

    def _publish_regroup(self, before: tuple[str, ...], keep: tuple[str, ...], added: list[str], batch: int, at_step: int | None, accum: int | None) -> _Pending | None:
        """Launch ranks on ``added`` workers, let them get ready while the job trains, publish the plan.

        None if the job finished while the new ranks got ready: they are told to leave.
        """
        self.lifecycle.move(CoordinatorState.RESCALING)
        version = self.next_version()
        t0 = time.time()
        new = [self.launch(addr, version) for addr in added]
        if new and not self._wait_ready(new, self.startup_s):
            if self.finished:
                # A joiner waits for its plan version; a stop plan sends it home at once rather
                # than holding its worker until the plan wait times out.
                self.publish(Plan(version, PlanKind.STOP, (), batch))
                self.pool.give_back(added)
                return None
            raise self.fail(f"new ranks {new} did not become ready; {occupancy(self.client, added)}")
        members = tuple(keep) + tuple(new)
        plan = Plan(version, PlanKind.RESCALE, members, batch, at_step=at_step, source=members[0] if new else None, accum_steps=accum)
        self.publish(plan)
        return _Pending(plan, before, time.time() - t0)

    def _await_regroup(self, pending: _Pending | None) -> RescaleOutcome | None:
        # Outside the plan lock: a failure meanwhile must be able to start recovery.
        if pending is None:
            return None
        plan = pending.plan
        event = self.wait_applied(plan.version, self.startup_s + self.eta_s(plan.at_step))
        self.lifecycle.move(CoordinatorState.RUNNING, only_from=(CoordinatorState.RESCALING,))
        if event is None:
            return None
        with self.plan_lock:
            if event.version == plan.version:
                self.members, self.global_batch, self.accum_steps = plan.members, plan.global_batch, plan.accum_steps
            # (else a recovery replaced it, e.g. a member never reached the rendezvous, and set them)
            self.pool.give_back((self.worker_of[u] for u in pending.before if u not in self.members), owner=self.job_id)
        outcome = RescaleOutcome(event.version, PlanKind.RESCALE, len(pending.before), len(self.members), self.global_batch, event.step, event.pause_s, pending.prepare_s)
        self.rescales.append(outcome)
        return outcome

    def _heard(self, event: RankEvent) -> None:
        """On the pump's thread, after ``event`` was recorded."""
        if event.kind == EventKind.FINISHED:
            self.lifecycle.move(CoordinatorState.SUCCEEDED)
        elif event.kind == EventKind.ERROR:
            self.lifecycle.move(CoordinatorState.FAILED)
        elif event.kind == EventKind.STRAGGLER:
            if self.on_straggler is not None:
                self.on_straggler(event.uid, event.step)
            if self.remove_stragglers and event.uid in self.members:
                # Not on the pump's thread: the switch waits for events the pump delivers.
                threading.Thread(target=self._remove_quietly, args=(event.uid,), daemon=True).start()

    def _wait_ready(self, uids: list[str], timeout: float) -> bool:
        """True once every rank in ``uids`` is ready; False on timeout or if the job finished first
        (a joiner that finds the job's final checkpoint never reports ready)."""
        ready = self.wait_for(lambda h: "finished" if h.finished else ("ready" if all(u in h.ready for u in uids) else None), timeout)
        return ready == "ready"

    def _raise_errors(self) -> None:
        if self.pump.heard.errors:
            e = self.pump.heard.errors[0]
            raise self.fail(f"rank {e.uid} failed: {e.detail}")
        for uid, fut in list(self.futures.items()):
            if fut.status == "error" and uid in self.members and not self.pump.heard.failed:
                exc = fut.exception()
                raise self.fail(f"rank {uid} failed: {type(exc).__name__}: {exc}")

    def _remove_quietly(self, uid: str) -> None:
        try:
            outcome = self.replace(uid)
        except Exception as exc:  # noqa: BLE001 - removal is an optimisation; training goes on
            log.warning("job %s: could not remove straggler %s: %s", self.job_id, uid, exc)
            return
        if outcome is not None:
            self.removed_stragglers.append((outcome.step, uid))
