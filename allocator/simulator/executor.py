"""A modelled cluster: each job advances at T(b, k) samples/s; a rescale costs lost seconds.

Completions are kept in a heap of (time, priority, sequence, job) so that equal times pop in
a fixed order (SimPy's rule); entries made stale by a later rescale are skipped lazily.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass

from allocator.execution import JobFailure, share_changes
from allocator.loop import EPS
from allocator.throughput import throughput
from allocator.types import Allocation, JobSpec, RescaleEvent, RescaleKind, Share

# Seconds a batch-only change costs a job: the ranks reopen their data stream at the new batch
# and keep training (no regroup, no state copy). Measured on gloo CPU ranks (docs/simulator.md).
BATCH_CHANGE_S = 0.0


@dataclass(frozen=True, slots=True)
class RescaleCost:
    """Seconds of progress a job loses per event. Elan reports ~1 s in place; checkpoint-restart
    of one worker cost 9-12 s on the reference H100 (shared/reference). A batch-only change
    (same GPUs) keeps the process group: the ranks switch batch at a step boundary, reopening
    their data stream (``batch_s``; see docs/simulator.md for the measurement)."""

    in_place_s: float = 1.0
    restart_s: float = 10.0
    start_s: float = 0.0
    in_place: bool = True
    batch_s: float = BATCH_CHANGE_S
    checkpoint_s: float = 0.0  # seconds one checkpoint write holds the job's steps (measured: sim_vs_real_bench --calibrate)
    checkpoint_every: int = 0  # steps between two writes (0: the job writes none)

    def __post_init__(self) -> None:
        for name in ("in_place_s", "restart_s", "start_s", "batch_s", "checkpoint_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"RescaleCost.{name}={value!r}: must be a finite number >= 0")
        if not (isinstance(self.checkpoint_every, int) and not isinstance(self.checkpoint_every, bool) and self.checkpoint_every >= 0):
            raise ValueError(f"RescaleCost.checkpoint_every={self.checkpoint_every!r}: must be an integer >= 0")

    @property
    def checkpoint_per_step_s(self) -> float:
        """A checkpoint write's seconds spread over the steps between two writes."""
        return self.checkpoint_s / self.checkpoint_every if self.checkpoint_every else 0.0


def checkpointed_rate(spec: JobSpec, share: Share, cost: RescaleCost) -> float:
    """Samples/s on ``share`` with the checkpoint writes' time spread over the steps: B / (t_step + c)."""
    rate = throughput(spec.profile, share.batch, share.gpus, share.accum_steps)
    extra = cost.checkpoint_per_step_s
    return rate if rate <= 0 or extra == 0 else share.batch / (share.batch / rate + extra)


def classify(before: Share | None, after: Share | None, cost: RescaleCost) -> tuple[RescaleKind, float]:
    """What a change of share is, and the seconds of progress it costs the job."""
    if before is None:
        return RescaleKind.START, cost.start_s
    if after is None:
        return RescaleKind.STOP, 0.0
    if after.gpus == before.gpus:
        return RescaleKind.BATCH, cost.batch_s
    if cost.in_place:
        return RescaleKind.IN_PLACE, cost.in_place_s
    return RescaleKind.RESTART, cost.restart_s


@dataclass(slots=True)
class _JobState:
    spec: JobSpec
    done: float = 0.0  # samples, as of ``since``
    since: float = 0.0
    paused_until: float = 0.0
    rate: float = 0.0
    version: int = 0
    finished: bool = False

    def progress_at(self, t: float) -> float:
        active = max(0.0, t - max(self.since, self.paused_until))
        return min(float(self.spec.total_samples), self.done + self.rate * active)

    def settle(self, t: float) -> None:
        self.done = self.progress_at(t)
        self.since = max(t, self.since)

    def finish_time(self) -> float | None:
        if self.rate <= 0:
            return None
        start = max(self.since, self.paused_until)
        return start + (self.spec.total_samples - self.done) / self.rate


class SimExecutor:
    def __init__(self, default_cost: RescaleCost = RescaleCost(), costs: Mapping[str, RescaleCost] | None = None) -> None:
        self._default = default_cost
        self._costs = dict(costs or {})
        self._jobs: dict[str, _JobState] = {}
        self._heap: list[tuple[float, int, int, str, int]] = []
        self._sequence = 0

    def _cost(self, job_id: str) -> RescaleCost:
        return self._costs.get(job_id, self._default)

    def _push(self, state: _JobState) -> None:
        t = state.finish_time()
        if t is not None:
            self._sequence += 1
            heapq.heappush(self._heap, (t, 0, self._sequence, state.spec.id, state.version))

    def apply(self, now: float, previous: Allocation, new: Allocation, jobs: Mapping[str, JobSpec]) -> list[RescaleEvent]:
        events = []
        for job_id, before, after in share_changes(previous, new):
            state = self._jobs.get(job_id)
            if state is None:
                state = self._jobs[job_id] = _JobState(spec=jobs[job_id], since=now, paused_until=now)
            if state.finished:
                continue
            state.settle(now)
            cost = self._cost(job_id)
            kind, lost = classify(before, after, cost)
            state.paused_until = now + lost
            state.rate = checkpointed_rate(state.spec, after, cost) if after is not None else 0.0
            state.version += 1
            self._push(state)
            events.append(RescaleEvent(now, job_id, before, after, kind, cost_s=lost, measured=False))
        return events


    def progress(self, job_id: str, now: float) -> float:
        state = self._jobs.get(job_id)
        if state is None:
            return 0.0
        return state.done if state.finished else state.progress_at(now)

    def noise_scale(self, job_id: str, now: float) -> float | None:
        """Throughput physics has no gradient noise: nothing to report (``NoiseReporter``)."""
        return None

    def _pop_stale(self) -> None:
        while self._heap:
            _, _, _, job_id, version = self._heap[0]
            state = self._jobs[job_id]
            if state.finished or state.version != version:
                heapq.heappop(self._heap)
            else:
                return

    def completed(self, now: float) -> list[str]:
        done = []
        self._pop_stale()
        while self._heap and self._heap[0][0] <= now + EPS:
            _, _, _, job_id, _ = heapq.heappop(self._heap)
            state = self._jobs[job_id]
            state.done, state.since, state.rate, state.finished = float(state.spec.total_samples), now, 0.0, True
            done.append(job_id)
            self._pop_stale()
        return done

    def next_completion(self, now: float) -> float | None:
        self._pop_stale()
        return self._heap[0][0] if self._heap else None

    def failed(self, now: float) -> list[JobFailure]:
        """A modelled job never fails."""
        return []

    def in_effect(self, allocation: Allocation) -> Allocation:
        """A modelled job always runs on what it was given."""
        return allocation
