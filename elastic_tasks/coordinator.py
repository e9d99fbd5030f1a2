"""Drives one job's ranks through Dask: launch, rescale in place, restart, recover, stop.

The coordinator lives with the Dask client. It publishes numbered plans on the job board
and reads the ranks' events from a Dask queue in a monitor thread. A scale-out first
launches the new ranks and lets them build their model *while the job keeps training*;
only when all report ready is the plan published, so the job pauses just for the regroup
and the state copy (seed 002's asynchronous coordination). A rank that reports a failed
collective starts recovery: once every member has reported or is known dead, the
survivors form the next generation from the survivor furthest ahead.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from distributed import Client, Future

from elastic_tasks.board import EventKind, JobBoard, JobStatus, RankEvent
from elastic_tasks.cluster import WorkerPool, warm_up
from elastic_tasks.protocol import FROM_CHECKPOINT, Plan, PlanKind, RankExit, RankResult, RankSpec, StepRecord, TrainConfig
from elastic_tasks.recipe import load_entry_point
from elastic_tasks.state import has_checkpoint
from elastic_tasks.trainer import run_rank

log = logging.getLogger(__name__)


class JobFailed(RuntimeError):
    """The job cannot go on (a rank raised, nobody survived and no checkpoint exists, ...)."""


@dataclass(frozen=True, slots=True)
class RescaleOutcome:
    """One generation change as the coordinator saw it; ``pause_s`` is measured by the ranks."""

    version: int
    kind: PlanKind
    before: int
    after: int
    global_batch: int
    step: int
    pause_s: float  # training time lost: last step of the old generation -> new one ready
    prepare_s: float  # new ranks' start-up, overlapped with training (not lost)
    restart: bool = False


@dataclass(frozen=True, slots=True)
class RecoveryRecord:
    failed_version: int
    version: int
    survivors: tuple[str, ...]
    lost: tuple[str, ...]
    resumed_step: int
    last_reported_step: int
    pause_s: float
    from_checkpoint: bool

    @property
    def steps_lost(self) -> int:
        """Completed steps thrown away (the partial step in flight is redone on top)."""
        return max(0, self.last_reported_step - self.resumed_step)


@dataclass(frozen=True, slots=True)
class JobResult:
    job_id: str
    finished: bool
    steps: int
    samples_seen: int
    history: tuple[StepRecord, ...]
    rescales: tuple[RescaleOutcome, ...]
    recoveries: tuple[RecoveryRecord, ...]
    stragglers: tuple[tuple[int, str], ...]
    ranks: tuple[RankResult, ...]
    eval_loss: float | None
    eval_accuracy: float | None
    eval_metrics: tuple[tuple[str, float], ...] = ()  # the recipe's own eval metrics (name, mean)

    @property
    def final_loss(self) -> float | None:
        return self.history[-1].loss if self.history else None


@dataclass(frozen=True, slots=True)
class _Pending:
    plan: Plan
    before: tuple[str, ...]
    prepare_s: float


@dataclass
class _Events:
    """What the monitor has heard (guarded by the coordinator's condition)."""

    ready: set[str] = field(default_factory=set)
    applied: dict[int, RankEvent] = field(default_factory=dict)
    stopped: dict[int, RankEvent] = field(default_factory=dict)
    failed: dict[int, dict[str, int]] = field(default_factory=dict)
    stragglers: list[tuple[int, str]] = field(default_factory=list)
    errors: list[RankEvent] = field(default_factory=list)
    finished: RankEvent | None = None


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
    ) -> None:
        # Fail here, in the caller's process, before any rank task exists.
        load_entry_point(entrypoint)
        self.client, self.pool, self.job_id, self.entrypoint, self.config = client, pool, job_id, entrypoint, config
        # Scheduler-side state (plans, events, "started" marks, task keys) outlives a run on a
        # long-lived scheduler: a fresh token keeps a re-run of this job id from reading it.
        self.board_id = f"{job_id}.{uuid.uuid4().hex[:8]}"
        self.board = JobBoard(self.board_id, client)
        self.delays = dict(delays or {})  # launch order -> injected seconds per step
        self.on_straggler = on_straggler
        self.remove_stragglers = remove_stragglers
        self.members: tuple[str, ...] = ()
        self.worker_of: dict[str, str] = {}
        self.futures: dict[str, Future] = {}
        self.version = -1
        self.global_batch = config.global_batch
        self.rescales: list[RescaleOutcome] = []
        self.removed_stragglers: list[tuple[int, str]] = []
        self.recoveries: list[RecoveryRecord] = []
        self._counter = itertools.count()
        self._events = _Events()
        self._cond = threading.Condition()
        self._plan_lock = threading.RLock()
        self._closed = threading.Event()
        self._monitor: threading.Thread | None = None
        self._status: JobStatus | None = None
        self._stopping: tuple[str, ...] = ()
        self._results: dict[str, RankResult] = {}

    # -- public API ----------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.members)

    def start(self, gpus: int, global_batch: int | None = None) -> RescaleOutcome:
        batch = self.config.global_batch if global_batch is None else global_batch
        _check_batch(batch, gpus)
        workers = self.pool.take(self.job_id, gpus)
        # A job whose checkpoint directory holds its state (a service restarted after a crash or
        # a shutdown) resumes from it rather than starting over.
        source_of = FROM_CHECKPOINT if has_checkpoint(self.config.checkpoint_dir) else None
        with self._plan_lock:
            version = self._next_version()
            uids = [self._launch(addr, version) for addr in workers]
            t0 = time.time()
            self._publish(Plan(version, PlanKind.START, tuple(uids), batch, source=source_of or uids[0]))
            self.members, self.global_batch = tuple(uids), batch
        self._ensure_monitor()
        event = self._wait_applied(version, self._startup_timeout())
        if event is None and not self.finished:
            raise JobFailed(f"job {self.job_id}: its {gpus} rank(s) did not start within {self._startup_timeout():g} s; {self._occupancy(list(workers))}")
        outcome = RescaleOutcome(version, PlanKind.START, 0, gpus, batch, event.step if event else 0, event.pause_s if event else 0.0, time.time() - t0)
        self.rescales.append(outcome)
        return outcome

    def rescale(self, gpus: int, global_batch: int | None = None, at_step: int | None = None) -> RescaleOutcome | None:
        """Grow or shrink in place; blocks until the new generation trains. None if the job ended first.

        A shrink keeps the longest-running ranks (rank 0 first), so rank 0 stays where it is.
        """
        batch = self.global_batch if global_batch is None else global_batch
        _check_batch(batch, gpus)
        with self._plan_lock:
            before = self.members
            if gpus == len(before) and batch == self.global_batch:
                return None
            keep = before[:gpus]
            added = self.pool.take(self.job_id, gpus - len(keep)) if gpus > len(keep) else []
            pending = self._publish_regroup(before, keep, added, batch, at_step)
        return self._await_regroup(pending)

    def replace(self, uid: str, at_step: int | None = None) -> RescaleOutcome | None:
        """Take rank ``uid`` out (a straggler); a free worker, if any, replaces it in the same switch."""
        with self._plan_lock:
            before = self.members
            free = self.pool.free()
            if uid not in before or (len(before) == 1 and not free):
                return None
            keep = tuple(u for u in before if u != uid)
            added = self.pool.take(self.job_id, 1) if free else []
            pending = self._publish_regroup(before, keep, added, max(self.global_batch, len(keep) + len(added)), at_step)
        return self._await_regroup(pending)

    def _publish_regroup(self, before: tuple[str, ...], keep: tuple[str, ...], added: list[str], batch: int, at_step: int | None) -> _Pending | None:
        """Launch ranks on ``added`` workers, let them get ready while the job trains, publish the plan.

        None if the job finished while the new ranks got ready: they are told to leave.
        """
        version = self._next_version()
        t0 = time.time()
        new = [self._launch(addr, version) for addr in added]
        if new and not self._wait_ready(new, self._startup_timeout()):
            if self.finished:
                # A joiner waits for its plan version; a stop plan sends it home at once rather
                # than holding its worker until the plan wait times out.
                self._publish(Plan(version, PlanKind.STOP, (), batch))
                self.pool.give_back(added)
                return None
            raise JobFailed(f"job {self.job_id}: new ranks {new} did not become ready; {self._occupancy(added)}")
        members = tuple(keep) + tuple(new)
        plan = Plan(version, PlanKind.RESCALE, members, batch, at_step=at_step, source=members[0] if new else None)
        self._publish(plan)
        return _Pending(plan, before, time.time() - t0)

    def _await_regroup(self, pending: _Pending | None) -> RescaleOutcome | None:
        # Outside the plan lock: a failure meanwhile must be able to start recovery.
        if pending is None:
            return None
        plan = pending.plan
        event = self._wait_applied(plan.version, self._startup_timeout() + self._eta_s(plan.at_step))
        if event is None:
            return None
        with self._plan_lock:
            self.members, self.global_batch = plan.members, plan.global_batch
            self.pool.give_back(self.worker_of[u] for u in pending.before if u not in plan.members)
        outcome = RescaleOutcome(plan.version, PlanKind.RESCALE, len(pending.before), len(plan.members), plan.global_batch, event.step, event.pause_s, pending.prepare_s)
        self.rescales.append(outcome)
        return outcome

    def restart_rescale(self, gpus: int, global_batch: int | None = None, at_step: int | None = None, restart_processes: bool = True) -> RescaleOutcome | None:
        """The checkpoint-restart path: save, stop every rank (and its process), start anew from disk."""
        if self.config.checkpoint_dir is None:
            raise ValueError("checkpoint_dir=None: the restart path needs a checkpoint directory")
        batch = self.global_batch if global_batch is None else global_batch
        _check_batch(batch, gpus)
        with self._plan_lock:
            before = self.members
            old_workers = [self.worker_of[u] for u in before]
            version = self._next_version()
            self._publish(Plan(version, PlanKind.CHECKPOINT_STOP, (), batch, at_step=at_step))
            stopped = self._wait_for(lambda e: e.stopped.get(version) or e.finished, self._startup_timeout() + self._eta_s(at_step))
            if not isinstance(stopped, RankEvent) or stopped.kind != EventKind.STOPPED:
                return None
            for uid in before:
                self.futures[uid].result(timeout=self._startup_timeout())
            # Hand finished ranks' results over now: a restarted worker would otherwise make
            # the scheduler recompute the tasks whose results it held.
            self._harvest()
            if restart_processes:
                # Our own wait below, not restart_workers': it counts every worker of the cluster.
                self.client.restart_workers(old_workers, timeout=self._startup_timeout(), raise_for_error=False)
            self.pool.give_back(old_workers)
            wait_until = time.monotonic() + self._startup_timeout()
            while len(self.pool.free()) < gpus and time.monotonic() < wait_until:
                time.sleep(0.2)
            workers = self.pool.take(self.job_id, gpus)
            if restart_processes:
                # Fresh processes import torch and build the recipe first, as at cluster start
                # (measured: part of the restart's pause).
                warm_up(self.client, self.entrypoint, workers)
            version = self._next_version()
            uids = [self._launch(addr, version) for addr in workers]
            self._publish(Plan(version, PlanKind.RESCALE, tuple(uids), batch, source=FROM_CHECKPOINT))
            self.members, self.global_batch = tuple(uids), batch
        event = self._wait_applied(version, self._startup_timeout())
        if event is None:
            raise JobFailed(f"job {self.job_id}: restarted ranks did not come up")
        outcome = RescaleOutcome(version, PlanKind.RESCALE, len(before), gpus, batch, event.step, event.time - stopped.time, 0.0, restart=True)
        self.rescales.append(outcome)
        return outcome

    def stop(self) -> None:
        with self._plan_lock:
            if self._events.finished is None and self.members:
                self._publish(Plan(self._next_version(), PlanKind.STOP, (), self.global_batch))
            self._stopping, self.members = self.members, ()

    def suspend(self, timeout: float | None = None) -> bool:
        """Checkpoint and stop every rank (a service shutting down); True once rank 0 saved.

        The job's workers are free afterwards; a later ``start`` resumes from the checkpoint.
        """
        if self.config.checkpoint_dir is None:
            raise ValueError("checkpoint_dir=None: suspending a job needs a checkpoint directory")
        wait_s = 4 * self.config.timeout_s if timeout is None else timeout
        with self._plan_lock:
            if self._events.finished is not None or not self.members:
                return False
            version = self._next_version()
            self._publish(Plan(version, PlanKind.CHECKPOINT_STOP, (), self.global_batch))
            self._stopping, self.members = self.members, ()
        stopping = self._stopping
        # Workers killed with the service (Ctrl-C reaches a terminal's whole process group) never
        # answer: stop waiting once all of them are gone.
        stopped = self._wait_for(lambda e: e.stopped.get(version) or e.finished or all(self._dead(u) for u in stopping), wait_s)
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
        self.pool.give_back(self.worker_of.values())

    def status(self) -> JobStatus | None:
        status = self.board.status()
        if status is not None:
            self._status = status
        return self._status

    @property
    def finished(self) -> bool:
        return self._events.finished is not None

    def wait(self, timeout: float | None = None) -> JobResult:
        """Block until the job finishes (or stops); gather every rank's result."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_errors()
            if self._events.finished is not None or not self.members:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id}: not finished within {timeout:g} s")
            with self._cond:
                self._cond.wait(0.2)
        return self.collect()

    def collect(self) -> JobResult:
        for uid, fut in self.futures.items():
            if uid in (*self.members, *self._stopping) and fut.status == "pending":
                # Rank 0 announces the end just before its task returns: wait for the members.
                fut.result(timeout=self._startup_timeout())
        self._harvest()
        for fut in self.futures.values():
            if fut.status != "error":
                fut.cancel()  # joiners of a plan the job never reached
        results = list(self._results.values())
        self.close()
        self.pool.give_back(self.worker_of.values())
        history: dict[int, StepRecord] = {}
        for r in sorted(results, key=lambda r: r.step):
            for rec in r.history:
                history[rec.step] = rec
        final = next((r for r in results if r.eval is not None), None)
        best = max(results, key=lambda r: r.step, default=None)
        return JobResult(
            job_id=self.job_id,
            finished=self._events.finished is not None,
            steps=best.step if best else 0,
            samples_seen=best.samples_seen if best else 0,
            history=tuple(history[k] for k in sorted(history)),
            rescales=tuple(self.rescales),
            recoveries=tuple(self.recoveries),
            stragglers=tuple(self._events.stragglers),
            ranks=tuple(results),
            eval_loss=final.eval.loss if final and final.eval else None,
            eval_accuracy=final.eval.accuracy if final and final.eval else None,
            eval_metrics=final.eval.metrics if final and final.eval else (),
        )

    def close(self) -> None:
        self._closed.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=5)

    # -- internals -----------------------------------------------------------------------------

    def _occupancy(self, workers: list[str]) -> str:
        """What each worker is running now, for an error that says why a rank never started."""
        try:
            busy = self.client.processing(workers)
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not hide the real error
            return f"worker occupancy unknown ({type(exc).__name__})"
        return "running on those workers: " + ", ".join(f"{w}: {list(busy.get(w, ())) or 'nothing'}" for w in workers)

    def _startup_timeout(self) -> float:
        return max(120.0, 4 * self.config.timeout_s)

    def _eta_s(self, at_step: int | None) -> float:
        if at_step is None:
            return 0.0
        status = self.status()
        if status is None or at_step <= status.step:
            return 0.0
        return 3600.0  # waiting for a future step: bounded by the job's own length, not by us

    def _next_version(self) -> int:
        latest = self.board.latest_version()
        self.version = max(self.version, -1 if latest is None else latest) + 1
        return self.version

    def _publish(self, plan: Plan) -> None:
        self.board.publish(plan)

    def _launch(self, worker: str, version: int) -> str:
        n = next(self._counter)
        uid = f"{self.job_id}-r{n}"
        spec = RankSpec(self.board_id, uid, self.entrypoint, self.config, version, delay_s=self.delays.get(n, 0.0))
        self.worker_of[uid] = worker
        self.futures[uid] = self.client.submit(
            run_rank, spec, key=f"malleable-rank-{self.board_id}-r{n}", workers=[worker], allow_other_workers=False, resources={"GPU": 1}, pure=False
        )
        return uid

    def _ensure_monitor(self) -> None:
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._monitor_loop, daemon=True, name=f"malleable-monitor-{self.job_id}")
            self._monitor.start()

    def _wait_for(self, predicate: Callable[[_Events], object], timeout: float) -> object:
        self._ensure_monitor()
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(self._events)
                if value:
                    return value
                if self._events.errors:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.2))
        self._raise_errors()
        return None

    def _wait_ready(self, uids: list[str], timeout: float) -> bool:
        """True once every rank in ``uids`` is ready; False on timeout or if the job finished first
        (a joiner that finds the job's final checkpoint never reports ready)."""
        ready = self._wait_for(lambda e: "finished" if e.finished else ("ready" if all(u in e.ready for u in uids) else None), timeout)
        return ready == "ready"

    def _wait_applied(self, version: int, timeout: float) -> RankEvent | None:
        def applied(e: _Events) -> object:
            if version in e.applied:
                return e.applied[version]
            return "finished" if e.finished else None

        value = self._wait_for(applied, timeout)
        return value if isinstance(value, RankEvent) else None

    def _raise_errors(self) -> None:
        if self._events.errors:
            e = self._events.errors[0]
            raise JobFailed(f"job {self.job_id}: rank {e.uid} failed: {e.detail}")
        for uid, fut in list(self.futures.items()):
            if fut.status == "error" and uid in self.members and not self._events.failed:
                exc = fut.exception()
                raise JobFailed(f"job {self.job_id}: rank {uid} failed: {type(exc).__name__}: {exc}")

    def _monitor_loop(self) -> None:
        next_check = 0.0
        while not self._closed.is_set():
            try:
                events = self.board.drain(timeout=0.1)
            except Exception:  # noqa: BLE001 - the client is closing; nothing left to watch
                if self._closed.wait(0.2):
                    return
                continue
            for event in events:
                self._record(event)
            done = self._recovered_from()
            newest_applied = max(self._events.applied, default=-1)
            for version in sorted(self._events.failed):
                if version not in done and version >= newest_applied:
                    self._recover(version)
                    break
            else:
                # Every rank of a generation can die at once: then nobody reports a failed
                # collective, and the scheduler's view of the workers is the only witness.
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + 0.5
                    self._check_all_dead(newest_applied)

    def _check_all_dead(self, version: int) -> None:
        members = self.members
        if version < 0 or self._events.finished is not None or not members or version in self._recovered_from():
            return
        if version != self.version or not all(self._dead(u) for u in members):
            return
        with self._cond:
            self._events.failed.setdefault(version, {})
        self._recover(version)

    def _recovered_from(self) -> set[int]:
        return {r.failed_version for r in self.recoveries}

    def _record(self, event: RankEvent) -> None:
        with self._cond:
            e = self._events
            if event.kind == EventKind.READY:
                e.ready.add(event.uid)
            elif event.kind == EventKind.APPLIED:
                e.applied[event.version] = event
            elif event.kind == EventKind.STOPPED:
                e.stopped[event.version] = event
            elif event.kind == EventKind.FAILED:
                e.failed.setdefault(event.version, {})[event.uid] = event.step
            elif event.kind == EventKind.STRAGGLER:
                e.stragglers.append((event.step, event.uid))
            elif event.kind == EventKind.FINISHED:
                e.finished = event
            elif event.kind == EventKind.ERROR:
                e.errors.append(event)
            self._cond.notify_all()
        if event.kind == EventKind.STRAGGLER:
            if self.on_straggler is not None:
                self.on_straggler(event.uid, event.step)
            if self.remove_stragglers and event.uid in self.members:
                # Not on the monitor thread: the switch waits for events the monitor delivers.
                threading.Thread(target=self._remove_quietly, args=(event.uid,), daemon=True).start()

    def _harvest(self) -> None:
        """Move finished ranks' results into the coordinator and release their futures."""
        for uid, fut in list(self.futures.items()):
            if fut.status == "finished":
                self._results[uid] = fut.result()
                fut.release()
                del self.futures[uid]

    def _remove_quietly(self, uid: str) -> None:
        try:
            outcome = self.replace(uid)
        except Exception as exc:  # noqa: BLE001 - removal is an optimisation; training goes on
            log.warning("job %s: could not remove straggler %s: %s", self.job_id, uid, exc)
            return
        if outcome is not None:
            self.removed_stragglers.append((outcome.step, uid))

    def _dead(self, uid: str) -> bool:
        fut = self.futures.get(uid)
        if fut is not None and fut.status in ("error", "cancelled", "lost"):
            return True
        return self.worker_of.get(uid) not in set(self.pool.alive())

    def _recover(self, failed_version: int) -> None:
        """Every member of the failed generation reported or is dead (or time is up): regroup."""
        with self._plan_lock:
            if failed_version in self._recovered_from():
                return
            plan = self.board.plan(failed_version, timeout=5.0)
            members = plan.members
            deadline = time.monotonic() + self.config.timeout_s + 5.0
            while time.monotonic() < deadline:
                reported = self._events.failed.get(failed_version, {})
                if all(u in reported or self._dead(u) for u in members):
                    break
                for event in self.board.drain(timeout=0.1):
                    self._record(event)
            reported = dict(self._events.failed.get(failed_version, {}))
            survivors = tuple(u for u in members if u in reported and not self._dead(u))
            lost = tuple(u for u in members if u not in survivors)
            for uid in lost:
                fut = self.futures.get(uid)
                if fut is not None:
                    fut.cancel()
                self.pool.give_back([self.worker_of[uid]])
            last_status = self.status()
            last_step = max([*reported.values(), last_status.step if last_status else 0])
            version = self._next_version()
            if survivors:
                source = max(survivors, key=lambda u: (reported[u], -members.index(u)))
                batch = max(self.global_batch, len(survivors))
                new_plan = Plan(version, PlanKind.RECOVER, survivors, batch, source=source)
                resumed = reported[source]
            elif has_checkpoint(self.config.checkpoint_dir):
                # Nannies restart killed workers (under new addresses): wait for some to return.
                wait_until = time.monotonic() + self._startup_timeout()
                while not self.pool.free() and time.monotonic() < wait_until:
                    time.sleep(0.5)
                workers = self.pool.take(self.job_id, max(1, min(len(members), len(self.pool.free()))))
                survivors = tuple(self._launch(addr, version) for addr in workers)
                new_plan = Plan(version, PlanKind.RECOVER, survivors, max(self.global_batch, len(survivors)), source=FROM_CHECKPOINT)
                resumed = -1
            else:
                with self._cond:
                    self._events.errors.append(
                        RankEvent(EventKind.ERROR, "-", failed_version, last_step, detail="every rank was lost and no checkpoint exists")
                    )
                    self._cond.notify_all()
                self.recoveries.append(RecoveryRecord(failed_version, version, (), lost, -1, last_step, float("nan"), False))
                return
            if new_plan.source == FROM_CHECKPOINT:
                log.warning("job %s: generation %d lost every rank %s; %d new rank(s) resume from the last checkpoint", self.job_id, failed_version, lost, len(survivors))
            else:
                log.warning("job %s: generation %d lost %s; %d survivor(s) continue", self.job_id, failed_version, lost, len(survivors))
            self._publish(new_plan)
            self.members, self.global_batch = new_plan.members, new_plan.global_batch
            record = RecoveryRecord(failed_version, version, survivors, lost, resumed, last_step, float("nan"), new_plan.source == FROM_CHECKPOINT)
            self.recoveries.append(record)
        # Wait for the new generation here (the monitor must keep pumping events meanwhile).
        deadline = time.monotonic() + self._startup_timeout()
        while time.monotonic() < deadline and version not in self._events.applied and not self._events.finished:
            for event in self.board.drain(timeout=0.1):
                self._record(event)
        applied = self._events.applied.get(version)
        if applied is not None:
            # The survivors time the pause from the moment their collective failed.
            self.recoveries[-1] = RecoveryRecord(
                failed_version, version, survivors, lost, applied.step if resumed < 0 else resumed, last_step, applied.pause_s, record.from_checkpoint
            )


def _check_batch(batch: int, gpus: int) -> None:
    if not (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 1):
        raise ValueError(f"gpus={gpus!r}: must be a positive integer")
    if not (isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1):
        raise ValueError(f"global_batch={batch!r}: must be a positive integer")
    if batch < gpus:
        raise ValueError(f"global_batch={batch!r}: must be >= gpus={gpus} so every rank gets a sample")
