"""The end-of-step agreement of one generation: one allreduce per step, read one step later.

One SUM allreduce carries everything: [loss, correct, count, throughput per rank, newest
plan version seen per rank, rank 0's evaluation clock]; each rank fills only its own slots,
so the sum is every rank's value side by side (versions are small integers: exact in float64). It is issued
asynchronously and read one step later, so it overlaps the next step's compute instead of
adding a second synchronisation point per step; every rank reads step t's agreement at the
same boundary, so decisions taken on it stay identical across ranks. A generation of one rank
has nobody to agree with: the sum is its own vector, so it issues no collective at all (one
gloo allreduce costs a thread hand-off, ~70 µs of CPU per step: most of the elastic step's
overhead over plain DDP at world size 1, benchmarks/step_work_bench.py).

This module only talks to the process group and keeps the clock of each step; what a read
agreement means (history, stragglers, status, plans) is the rank loop's business.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from elastic_tasks.rank.health.abandon import DataPlaneWaits
from elastic_tasks.rank.health.collective import collective
from elastic_tasks.protocol import StepRecord


@dataclasses.dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one rank brings to a step's agreement, and the clock its record needs."""

    step: int  # the step just computed (0-based)
    loss_sum: float  # summed over this rank's samples
    correct: float
    count: int  # this rank's samples
    throughput: float  # this rank's samples per second of local work (before the gradient allreduce)
    global_batch: int
    lr: float
    t0: float  # perf_counter() at the step's start
    cpu0: float  # process_time() at the step's start
    group_lrs: tuple[float, ...] = ()  # the LR each parameter group stepped with
    eval_clock: float = 0.0  # rank 0: seconds since the job last evaluated (eval_schedule); others 0


@dataclasses.dataclass(frozen=True, slots=True)
class Agreed:
    """A read agreement: the step's record and what every rank put in."""

    record: StepRecord
    throughput: tuple[float, ...]  # samples per second of local work, per rank in plan order
    newest_version: int  # the newest plan version any rank had seen
    eval_clock: float = 0.0  # rank 0's seconds since the last evaluation, when the step was issued


@dataclasses.dataclass(frozen=True, slots=True)
class _InFlight:
    """A step's agreement allreduce, issued but not yet read."""

    work: dist.Work | None  # None: a generation of one rank, nothing to reduce
    stats: torch.Tensor | list[float]  # the host list itself when there is no collective
    outcome: StepOutcome


class Agreement:
    """One generation's agreements, at most one in flight (the last step's)."""

    def __init__(self, rank: int, world: int, waits: DataPlaneWaits | None = None) -> None:
        self.rank = rank
        self.world = world
        self.waits = waits if waits is not None else DataPlaneWaits()  # the hang watch's, to be freed by it
        self._inflight: _InFlight | None = None

    def issue(self, outcome: StepOutcome, seen_version: int, noise_scale: float | None) -> Agreed | None:
        """Launch ``outcome``'s agreement; return the previous step's, now read (None on a generation's first step).

        ``noise_scale`` is recorded with the step read (the probe's estimate at reading time).
        """
        t_agree = time.perf_counter()
        w = self.world
        if w == 1:  # the same slots, as one list: its own values are the sum
            inflight = _InFlight(None, [outcome.loss_sum, outcome.correct, outcome.count, outcome.throughput, seen_version, outcome.eval_clock], outcome)
        else:
            values = [0.0] * (4 + 2 * w)  # filled on the host, one tensor made of it: a few µs less than per-slot writes
            values[0], values[1], values[2] = outcome.loss_sum, outcome.correct, outcome.count
            values[3 + self.rank] = outcome.throughput
            values[3 + w + self.rank] = seen_version
            values[3 + 2 * w] = outcome.eval_clock
            stats = torch.tensor(values, dtype=torch.float64)
            with collective(f"agreement of step {outcome.step}"):
                inflight = _InFlight(dist.all_reduce(stats, async_op=True), stats, outcome)
        previous, self._inflight = self._inflight, inflight
        if previous is None:
            return None
        if previous.work is None:  # nothing to wait for
            return self._record(previous, outcome, t_agree, noise_scale)
        return self._read(previous, next_step=outcome, t_agree=t_agree, noise_scale=noise_scale)

    def settle(self, noise_scale: float | None) -> Agreed | None:
        """Wait for the agreement in flight and read it (before a switch, a stop or the end)."""
        pending, self._inflight = self._inflight, None
        if pending is None:
            return None
        return self._read(pending, next_step=None, t_agree=time.perf_counter(), noise_scale=noise_scale)

    def salvage(self, noise_scale: float | None) -> Agreed | None:
        """The group is going away with an agreement in flight (a peer failed): its step was
        taken (its gradients were reduced), so it keeps a record — the agreed one if the
        allreduce completed, else one over this rank's own samples (``loss_samples``)."""
        pending, self._inflight = self._inflight, None
        if pending is None:
            return None
        t_agree = time.perf_counter()
        try:
            if pending.work is None:
                return self._record(pending, next_step=None, t_agree=t_agree, noise_scale=noise_scale)
            if pending.work.is_completed():
                pending.work.wait()
                return self._record(pending, next_step=None, t_agree=t_agree, noise_scale=noise_scale)
        except Exception:  # noqa: BLE001 - it failed with the group; the step's state is kept
            pass
        return self.own_record(pending.outcome, noise_scale)

    def own_record(self, step: StepOutcome, noise_scale: float | None) -> Agreed:
        """A step's record when its agreement never completed: this rank's own samples only."""
        count = max(step.count, 1)
        record = StepRecord(
            step.step,
            step.loss_sum / count,
            step.correct / count,
            self.world,
            step.global_batch,
            step.lr,
            # Its local work only: the rest of the wall time since the step began is the failure.
            step.count / step.throughput if step.throughput > 0 else 0.0,
            0.0,
            0.0,
            noise_scale=noise_scale,
            loss_samples=step.count,
            group_lrs=step.group_lrs,
        )
        throughput = tuple(step.throughput if r == self.rank else 0.0 for r in range(self.world))
        return Agreed(record, throughput, 0)

    def _read(self, done: _InFlight, next_step: StepOutcome | None, t_agree: float, noise_scale: float | None) -> Agreed:
        if done.work is not None:
            with collective(f"agreement of step {done.outcome.step}"):
                self.waits.wait(done.work)
        return self._record(done, next_step, t_agree, noise_scale)

    def _record(self, done: _InFlight, next_step: StepOutcome | None, t_agree: float, noise_scale: float | None) -> Agreed:
        stats = done.stats if isinstance(done.stats, list) else done.stats.tolist()  # one read, not one per slot
        step, w = done.outcome, self.world
        now = time.perf_counter()
        # A step lasts from its start to the next step's start (or, for the last, to now).
        wall = (next_step.t0 if next_step is not None else now) - step.t0
        cpu = (next_step.cpu0 if next_step is not None else time.process_time()) - step.cpu0
        record = StepRecord(
            step.step,
            stats[0] / step.global_batch,
            stats[1] / step.global_batch,
            w,
            step.global_batch,
            step.lr,
            wall,
            now - t_agree,
            cpu,
            noise_scale=noise_scale,
            group_lrs=step.group_lrs,
        )
        throughput = tuple(stats[3 : 3 + w])
        return Agreed(record, throughput, int(max(stats[3 + w : 3 + 2 * w])), stats[3 + 2 * w])
