"""The rank loop: one long-running Dask task per worker; the world size changes between steps.

A rank builds its recipe once, then lives through *generations* (numbered plans). Each
generation is one process group whose rank 0 hosts the rendezvous (a fresh ``TCPStore`` on
its own host, address published through the job board; ``process_group.py``). On a plan
change the surviving ranks keep their process, model and optimizer tensors; they destroy the
old process group, join the new one, and — if someone new joined — everyone copies the state
of a survivor over the collective backend (no disk). Ranks not in the new plan leave cleanly.

Coordination is asynchronous (seed 002): a background thread (``plan_watcher.py``) watches the
board for new plans while training runs; at the end of every step the ranks agree, in one
tiny allreduce that also sums the step's loss (``agreement.py``), on the newest plan any of
them has seen, and all switch at the same step boundary (``plan_switch.py``). A collective
that fails (a peer died) raises ``CollectiveFailure`` and sends the rank into recovery: it
reports its step and waits for the coordinator's recovery plan, losing at most the step in
flight. What it records and reports as it goes is ``reporting.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator

import torch
from distributed import get_client, get_worker
from distributed.comm import get_address_host
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.rank import step as steps
from elastic_tasks.rank.agreement import Agreed, Agreement, StepOutcome
from elastic_tasks.rank.state.checkpoint_writer import CheckpointWriter, CommitGuard
from elastic_tasks.rank.step_clock import LocalClock
from elastic_tasks.board import EventKind, Fenced, JobBoard, RankEvent
from elastic_tasks.rank.health import gradient_hook
from elastic_tasks.rank.health.collective import CollectiveFailure, HookWitness, collective
from elastic_tasks.rank.accounting.pending import PendingOutcome
from elastic_tasks.rank.step_work import StepWork
from elastic_tasks.rank.plan_switch import PlanSwitch
from elastic_tasks.rank.process_group import ProcessGroups
from elastic_tasks.rank.host_share import HostShare
from elastic_tasks.rank.plan_watcher import Courier as _Courier, watches
from elastic_tasks.protocol import (
    FROM_CHECKPOINT,
    EvalResult,
    Plan,
    PlanKind,
    RankExit,
    RankResult,
    RankSpec,
)
from elastic_tasks.devices import default_backend, rank_device
from elastic_tasks.rank.evaluation.evaluate import RankEvaluation
from elastic_tasks.rank.forward import rank_ddp
from elastic_tasks.rank.health.hang_watch import HangWatch, simulate_hang_requested
from elastic_tasks.rank.data.loader import RankLoader
from elastic_tasks.rank.noise.probe_schedule import SampleSchedule
from elastic_tasks.rank.noise.scale import GradientNoiseProbe
from elastic_tasks.rank.accounting.records import RankRecords
from elastic_tasks.rank.reporting import RankReporter
from elastic_tasks.recipe import TrainingRecipe, build_optimizer, load_entry_point
from elastic_tasks.rank.scaling import initial_lr, plan_accumulation, rescale_lr
from elastic_tasks.rank.data.sharding import EpochSampler
from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta, has_checkpoint, read_meta
from elastic_tasks.rank.health.straggler import StragglerDetector
from elastic_tasks.rank.accounting.wall_split import Phase, WallTimeline
from elastic_tasks.coordinator.timeouts import plan_wait_s, rendezvous_wait_s

log = logging.getLogger(__name__)

def run_rank(spec: RankSpec) -> RankResult:
    """Dask task: train as rank ``spec.uid`` on board ``spec.board_id`` until the job ends or the rank leaves."""
    # Its writes go through the fence: once the coordinator declared this rank lost, the
    # scheduler refuses them and the rank leaves (``Fenced``), however late it comes back.
    board = JobBoard(spec.board_id, get_client(), writer=spec.uid)
    # Dask re-runs the tasks of a dead worker elsewhere; a rank's identity lives once only.
    if not board.mark_started(spec.uid):
        return RankResult(spec.uid, RankExit.DUPLICATE, step=0, samples_seen=0)
    try:
        return _Rank(spec, board).run()
    except Fenced as exc:
        # Not an error of the job's: it went on without this rank (a frozen host thawed, a cut link back).
        log.warning("rank %s: %s; it leaves without another write", spec.uid, exc)
        return RankResult(spec.uid, RankExit.FENCED, step=0, samples_seen=0)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            board.post(RankEvent(EventKind.ERROR, spec.uid, spec.join_version, -1, detail=f"{type(exc).__name__}: {exc}"[:500]))
        raise
    finally:
        ProcessGroups.drop()


class _Rank(StepWork):
    def __init__(self, spec: RankSpec, board: JobBoard) -> None:
        t_created = time.time()
        self.wall = WallTimeline()  # where this rank's wall time goes (allocator.wall_split)
        self.spec = spec
        self.config = spec.config
        self.board = board
        self.host = get_address_host(get_worker().address)
        torch.set_num_threads(self.config.torch_threads)
        self.recipe: TrainingRecipe = load_entry_point(spec.entrypoint)
        self.backend = self.config.backend or default_backend()
        self.device = rank_device(self.backend)
        torch.manual_seed(self.config.seed)
        model = self.recipe.build_model().to(self.device)
        lr = initial_lr(self.recipe.base_lr, self.recipe.base_batch, self.config.global_batch)
        # Groups keep the user's own LRs; the batch factor is applied at each step (rank/lr.py).
        optimizer = build_optimizer(self.recipe, model)
        scheduler = self.recipe.make_scheduler(optimizer) if self.recipe.make_scheduler is not None else None
        meta = TrainMeta(step=0, samples_seen=0, global_batch=self.config.global_batch, lr=lr, rng_state=b"")
        self.state = ElasticState(model, optimizer, meta, steps.make_scaler(self.recipe.precision, self.device), scheduler)
        self.evaluation = RankEvaluation(self.recipe, self.config.max_batch_per_gpu, self.device)
        self.batches: Iterator[object] | None = None  # this generation's share, from the stream position it began at
        self.state.capture_rng()
        self.sampler = EpochSampler(len(self.recipe.dataset), self.config.seed)  # type: ignore[arg-type]
        self.loader = RankLoader(self.recipe, self.sampler)  # one per rank; loader workers outlive generations
        share = HostShare(spec.board_id)  # one rank of the job per host reads each plan for all of them
        self.courier = _Courier(board, share)
        self.switch = PlanSwitch(board, self.config, self.wall, share)  # the plan in effect and the next one
        self.rank = 0
        self.world = 0
        self.accum = 1  # micro-steps per step of the generation in effect (rank/scaling.plan_accumulation)
        self.ddp: DistributedDataParallel | None = None
        self.groups = ProcessGroups(board, self.host, self.backend, self.config)
        self.records = RankRecords()
        detector = StragglerDetector(self.config.straggler_alpha, self.config.straggler_threshold)
        self.report = RankReporter(spec.uid, board, self.courier, self.records, detector)
        self.agreement: Agreement | None = None  # this generation's end-of-step agreements
        self.pending: PendingOutcome | None = None  # the last step, its loss not read yet (rank/pending.py)
        # The gradient noise scale for goodput (issue 14), within its share of the step.
        self.noise = GradientNoiseProbe(schedule=SampleSchedule(cost_budget=self.config.noise_probe_budget))
        # Tells a failed gradient allreduce from the recipe's own errors; never calls into an aborted group.
        self.witness = HookWitness(self._group_aborted)
        # Rank 0's periodic checkpoints, off the step loop; each committed only while this rank is not fenced.
        self.guard = CommitGuard(spec.uid, lambda: self.plan.version if self.plan is not None else spec.join_version, board.confirm_writer)
        self.checkpoints = CheckpointWriter(self.guard)
        self.local_clock = LocalClock(self.device)  # straggler timing: CUDA events on a GPU
        # Frees a data-plane collective that a lost peer left hanging (nccl); rank/health/hang_watch.py.
        # The same abort on gloo (which cannot free a collective in flight): the group goes away either way.
        self.watch = HangWatch(board.aborted_generation, self.config.data_timeout_s, simulate_hang=simulate_hang_requested())
        self._step_region = self.watch.data_plane(-1, "a training step")  # a step's region, remade as each plan takes effect (``_adopt``)
        self.wall.record(Phase.START, t_created, time.time())

    @property
    def plan(self) -> Plan | None:
        return self.switch.current

    def _group_aborted(self) -> bool:
        """Whether the hang watch aborted the group in effect (DDP's hook asks, for every bucket)."""
        plan = self.switch.current
        return plan is not None and self.watch.aborted(plan.version)

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self) -> RankResult:
        finished = self._finished_checkpoint()
        if finished is not None:
            return finished
        self.courier.start()
        self.watch.start()
        try:
            self.board.post(RankEvent(EventKind.READY, self.spec.uid, self.spec.join_version, 0))
            with self.wall.phase(Phase.WAITING):
                plan = self.board.plan(self.spec.join_version, timeout=plan_wait_s(self.config))
            t_stop = time.time()
            while True:
                if plan.kind in (PlanKind.STOP, PlanKind.CHECKPOINT_STOP) or self.spec.uid not in plan.members:
                    return self._leave(plan, t_stop)
                try:
                    with self.wall.phase(Phase.START if self.plan is None else Phase.REGROUP):
                        self._enter(plan, t_stop)
                    plan = self._train_until_switch()
                    t_stop = time.time()
                    if plan is None:
                        return self._finish()
                except CollectiveFailure as exc:
                    t_stop = time.time()
                    with self.wall.phase(Phase.WAITING):
                        plan = self._recover(exc)
                    if plan is None:
                        return self._result(RankExit.LEFT)
        finally:
            self.courier.stop()
            self.watch.stop()

    def _finished_checkpoint(self) -> RankResult | None:
        """Idempotence: a job whose final checkpoint says finished is not trained again."""
        directory = self.config.checkpoint_dir
        if not has_checkpoint(directory):
            return None
        meta = read_meta(directory)  # type: ignore[arg-type]
        if not meta.finished:
            return None
        self.board.post(RankEvent(EventKind.FINISHED, self.spec.uid, self.spec.join_version, meta.step, detail="already finished"))
        return RankResult(self.spec.uid, RankExit.FINISHED, meta.step, meta.samples_seen)

    def _enter(self, plan: Plan, t_stop: float) -> None:
        """Join generation ``plan.version``: new process group, state from the source, new DDP."""
        self._drop_group()
        # A joiner's rank 0 may be a step or more from the switch; the ranks of a plan published
        # as they launched may still be starting (coordinator/timeouts.rendezvous_wait_s).
        opens_within = rendezvous_wait_s(self.config, patient=self.plan is None)
        arrive_within = rendezvous_wait_s(self.config, patient=plan.kind == PlanKind.START or plan.source == FROM_CHECKPOINT)
        self._adopt(plan)
        self.rank, self.world = plan.members.index(self.spec.uid), len(plan.members)
        self.courier.watching = watches(self.rank)  # the others learn new versions from the agreement
        self.agreement = Agreement(self.rank, self.world, self.watch.waits)
        with collective(f"rendezvous of generation {plan.version}"):
            self.groups.form(plan.version, self.rank, self.world, opens_within, arrive_within)
        self.switch.fan_out_through(self.groups.store, self.rank)  # plans due come through the generation's store
        with self.wall.phase(Phase.STATE_TRANSFER):
            if plan.source == FROM_CHECKPOINT:
                self.checkpoints.wait()
                self.state.load(self.config.checkpoint_dir)  # type: ignore[arg-type]
            elif plan.source is not None:
                with self.watch.data_plane(plan.version, "state broadcast"), collective(f"state broadcast of generation {plan.version}"):
                    src, chunk = plan.members.index(plan.source), self.config.broadcast_chunk_mb * 2**20
                    self.state.broadcast(src=src, chunk_bytes=chunk, waits=self.watch.waits)
        self._apply_batch(plan)
        self._open_loader()
        # DDP's parameter check is nccl's first collective, which creates the communicator: data plane.
        with self.watch.data_plane(plan.version, "DDP set-up"), collective(f"DDP set-up of generation {plan.version}"):
            # The whole recipe step runs inside DDP's forward; step_fn gets the raw model (rank/forward.py).
            self.ddp = rank_ddp(self.state.model, self.recipe)
        gradient_hook.install(self.ddp, self.watch.waits, self.witness)
        self.report.switched(plan, self.state.meta, self.rank, self.world, time.time() - t_stop, plan.source)

    def _adopt(self, plan: Plan) -> None:  # ``plan`` is in effect: the steps' data-plane region watches its version
        self.switch.adopt(plan)
        self._step_region = self.watch.data_plane(plan.version, "a training step")  # reused by every step until the next plan

    def _apply_batch(self, plan: Plan) -> None:
        meta = self.state.meta
        if plan.kind == PlanKind.START and meta.step == 0:
            lr = initial_lr(self.recipe.base_lr, self.recipe.base_batch, plan.global_batch)
            self.state.meta = dataclasses.replace(meta, global_batch=plan.global_batch, lr=lr)
        elif plan.global_batch != meta.global_batch:
            lr = rescale_lr(meta.lr, meta.step, meta.global_batch, plan.global_batch, self.config.lr_ramp_steps)
            self.state.meta = dataclasses.replace(meta, global_batch=plan.global_batch, lr=lr)
        self.accum = plan_accumulation(plan.accum_steps, plan.global_batch, self.world, self.config.max_batch_per_gpu)

    def _open_loader(self) -> None:
        """A DataLoader over this generation's share of the stream, from the position all ranks agree on."""
        meta = self.state.meta
        self.batches = self.loader.start(meta.samples_seen, meta.global_batch, self.world, self.rank, self.accum)

    def _drop_group(self) -> None:
        self.ddp = None
        self.batches = None  # what it prefetched past the switch is read again from the new position
        if self.agreement is not None:  # a peer failed during the next step: a completed agreement still counts
            self._record(self.agreement.salvage(self.noise.value))
            done, self.pending = self.pending, None  # a step taken, never agreed: this rank's own record
            if done is not None and done.ready():
                self._record(self.agreement.own_record(done.complete(), self.noise.value))
            self.agreement = None
        self.groups.drop(aborted=self.plan is not None and self.watch.aborted(self.plan.version))

    def _leave(self, plan: Plan, t_stop: float) -> RankResult:
        with self.wall.phase(Phase.CHECKPOINT):
            self.checkpoints.wait()  # what the loop saved is on disk before anyone is told it stopped
        if plan.kind == PlanKind.CHECKPOINT_STOP and self.rank == 0 and self.plan is not None:
            with self.wall.phase(Phase.CHECKPOINT):
                self.state.save(self.config.checkpoint_dir, self.guard)  # type: ignore[arg-type]
        if self.rank == 0 and self.plan is not None and plan.kind in (PlanKind.STOP, PlanKind.CHECKPOINT_STOP):
            self.board.post(RankEvent(EventKind.STOPPED, self.spec.uid, plan.version, self.state.meta.step, time=t_stop))
        self._drop_group()
        return self._result(RankExit.STOPPED if plan.kind in (PlanKind.STOP, PlanKind.CHECKPOINT_STOP) else RankExit.LEFT)

    def _finish(self) -> RankResult:
        evaluating = self.config.evaluate and self.recipe.eval_dataset is not None
        # Sharded: every rank takes part, so while the group lives (its gather is data plane); else rank 0 alone, after it.
        evaluation = None
        if evaluating and self.recipe.eval_sharded:
            with self.watch.data_plane(self.plan.version if self.plan else -1, "final evaluation"):
                evaluation = self._evaluate()
        with self.wall.phase(Phase.REGROUP):
            self._drop_group()
        with self.wall.phase(Phase.CHECKPOINT):
            self.checkpoints.wait()
        if self.rank == 0:
            self.state.meta = dataclasses.replace(self.state.meta, finished=True)
            if self.config.checkpoint_dir is not None:
                with self.wall.phase(Phase.CHECKPOINT):
                    self.state.save(self.config.checkpoint_dir, self.guard)
            if evaluating and not self.recipe.eval_sharded:
                evaluation = self._evaluate()
            self.courier.flush()
            self.board.post(RankEvent(EventKind.FINISHED, self.spec.uid, self.plan.version if self.plan else 0, self.state.meta.step))
        return self._result(RankExit.FINISHED, evaluation if self.rank == 0 else None)

    def _evaluate(self) -> EvalResult:
        with self.wall.phase(Phase.EVALUATION):
            return self.evaluation.run(self.state, self.rank, self.world)

    def _recover(self, exc: BaseException) -> Plan | None:
        """Report the failure and wait for the coordinator's recovery plan (or none: leave)."""
        failed = self.plan.version if self.plan is not None else self.spec.join_version
        self._drop_group()
        self.state.optimizer.zero_grad(set_to_none=True)
        step = self.state.meta.step
        self.records.recoveries.append((failed, step))
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # torch's futures append their traceback
        log.warning("rank %s: generation %d failed at step %d: %s", self.spec.uid, failed, step, why)
        blocked = self.watch.take_failed_region_s()
        self.board.post(RankEvent(EventKind.FAILED, self.spec.uid, failed, step, detail=why[:300], blocked_s=blocked))
        return self.switch.recovery(failed, self.spec.uid, self.courier)

    # -- training ------------------------------------------------------------------------------

    def _done(self) -> bool:
        meta, cfg = self.state.meta, self.config
        return (cfg.max_steps is not None and meta.step >= cfg.max_steps) or (
            cfg.total_samples is not None and meta.samples_seen >= cfg.total_samples
        )

    def _train_until_switch(self) -> Plan | None:
        """Train step by step; returns the plan to switch to, or None when the job is done.

        Each step's agreement runs while the next step computes (``elastic_tasks.rank.agreement``),
        so the loop drains the one in flight before it switches generation or finishes.
        """
        while True:
            # One STEPS phase for the run of steps, not one per step (phases nest: a checkpoint or
            # an evaluation inside it takes its own share).
            with self.wall.phase(Phase.STEPS):
                plan = self._steps_until_plan()
            if plan is not None and plan.kind == PlanKind.BATCH and self.plan is not None and plan.members == self.plan.members:
                with self.wall.phase(Phase.REGROUP):
                    self._switch_batch(plan)  # same group: no regroup (coordinator.batch_change)
                continue
            return plan

    def _steps_until_plan(self) -> Plan | None:
        """Steps until a plan is due (returned) or the job is done (None), the last agreement settled."""
        while not self._done():
            plan = self._one_step()
            if plan is not None:
                self._settle()
                return plan
        self._settle()  # the job is done: a plan that arrives with the last agreement is moot
        return None

    def _one_step(self) -> Plan | None:
        """One steady step as the loop runs it (benchmarks/step_work_bench.py drives this alone)."""
        with self._step_region:  # the hang watch's data-plane region: an abort meanwhile fails the step
            done, self.pending = self.pending, self._step()  # read the step before, now this one is queued
            plan = self._agree(None if done is None else done.complete())
        cfg = self.config
        if cfg.checkpoint_every and self.rank == 0 and self.state.meta.step % cfg.checkpoint_every == 0:
            with self.wall.phase(Phase.CHECKPOINT):  # the snapshot to host memory; the write runs behind
                self.checkpoints.save(self.state, cfg.checkpoint_dir)  # type: ignore[arg-type]
        return plan

    def _switch_batch(self, plan: Plan) -> None:
        """A batch-only plan: keep the process group and DDP; the next step runs the new batch."""
        t_stop = time.time()
        self._adopt(plan)
        self._apply_batch(plan)
        self.batches = None  # what it prefetched at the old batch is read again from the switch step
        self._open_loader()
        self.report.switched(plan, self.state.meta, self.rank, self.world, time.time() - t_stop, None)

    def _agree(self, outcome: StepOutcome | None) -> Plan | None:
        """Issue the previous step's agreement (its values complete by now) and act on the one before it."""
        assert self.agreement is not None
        plan = self.switch.current
        assert plan is not None
        agreed = None
        if outcome is not None:  # (``_noise_value`` and ``_record`` inlined: every step)
            agreed = self.agreement.issue(outcome, self.courier.seen_version, self.noise.value if self.config.noise_probe else None)
            if agreed is not None:
                self.report.stepped(agreed, plan, self.state.meta, self.rank, self.world, self.accum)
        done = self._done()
        if self.evaluation.periodic and self.evaluation.due(self.state, agreed, done):  # asked outside the phase: it is not, nearly every step
            with self.wall.phase(Phase.EVALUATION):
                result = self.evaluation.if_due(self.state, self.rank, self.world, agreed, done)
            if result is not None:
                self.records.evals.append(result)
        return self.switch.due(plan.version if agreed is None else agreed.newest_version, self.state.meta.step)

    def _noise_value(self) -> float | None:  # with the probe off it never measures: none to ask for
        return self.noise.value if self.config.noise_probe else None

    def _settle(self) -> None:
        """Record the agreement in flight (before a switch, a stop or the end); a plan it reveals is moot."""
        assert self.agreement is not None
        with self.watch.data_plane(self.plan.version if self.plan else -1, "agreement"):
            done, self.pending = self.pending, None
            if done is not None:  # the last step's agreement, at the same boundary on every rank
                self._record(self.agreement.issue(done.complete(), self.courier.seen_version, self._noise_value()))
            self._record(self.agreement.settle(self._noise_value()))

    def _record(self, agreed: Agreed | None) -> None:
        self.report.stepped(agreed, self.plan, self.state.meta, self.rank, self.world, self.accum)

    def _result(self, exit_: RankExit, evaluation: EvalResult | None = None) -> RankResult:
        return dataclasses.replace(self.records.result(self.spec.uid, exit_, self.state.meta, evaluation), wall=self.wall.snapshot())
