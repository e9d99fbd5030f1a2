"""A modelled cluster: each job advances at T(b, k) samples/s; a rescale costs lost seconds.

The completion heap and the loop's executor protocol are ``allocator.simulator.modelled``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from allocator.simulator.modelled import ModelledCluster
from allocator.physics.throughput import throughput
from allocator.types import JobSpec, RescaleKind, Share

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
    rate = throughput(spec.profile, share.global_batch, share.gpus, share.accum_steps)
    extra = cost.checkpoint_per_step_s
    return rate if rate <= 0 or extra == 0 else share.global_batch / (share.global_batch / rate + extra)


def change_cost_s(cost: RescaleCost) -> float:
    """What a change of GPU count costs under ``cost``: in place, or a checkpoint-restart."""
    return cost.in_place_s if cost.in_place else cost.restart_s


def classify(before: Share | None, after: Share | None, cost: RescaleCost, resumed: bool = False) -> tuple[RescaleKind, float]:
    """What a change of share is, and the seconds of progress it costs the job. ``resumed``: the job
    ran before and was stopped (preempted); starting it again is a restart from its checkpoint."""
    if before is None:
        return (RescaleKind.RESTART, cost.restart_s) if resumed else (RescaleKind.START, cost.start_s)
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
    cost: RescaleCost  # what a change and a checkpoint write cost this job
    done: float = 0.0  # samples, as of ``since``
    since: float = 0.0
    paused_until: float = 0.0
    rate: float = 0.0
    version: int = 0
    finished: bool = False

    def progress_at(self, t: float) -> float:
        active = max(0.0, t - max(self.since, self.paused_until))
        return min(float(self.spec.work_samples), self.done + self.rate * active)

    def settle(self, t: float) -> None:
        self.done = self.progress_at(t)
        self.since = max(t, self.since)

    def run(self, share: Share | None) -> None:
        self.rate = checkpointed_rate(self.spec, share, self.cost) if share is not None else 0.0

    def finish_time(self) -> float | None:
        if self.rate <= 0:
            return None
        start = max(self.since, self.paused_until)
        return start + (self.spec.work_samples - self.done) / self.rate


class SimExecutor(ModelledCluster[_JobState]):
    """Jobs advance at T(b, k) samples/s; a change costs what ``RescaleCost`` says (per job)."""

    def __init__(self, default_cost: RescaleCost = RescaleCost(), costs: Mapping[str, RescaleCost] | None = None) -> None:
        super().__init__()
        self._default = default_cost
        self._costs = dict(costs or {})

    def _new_job(self, spec: JobSpec, now: float) -> _JobState:
        return _JobState(spec=spec, cost=self._costs.get(spec.id, self._default), since=now, paused_until=now)

    def _change_cost(self, job_id: str, before: Share | None, after: Share | None, resumed: bool = False) -> tuple[RescaleKind, float]:
        return classify(before, after, self._costs.get(job_id, self._default), resumed)

    def change_cost(self, job_id: str) -> float:
        """What a GPU-count change costs this job (``ChangeCostReporter``)."""
        return change_cost_s(self._costs.get(job_id, self._default))

    def noise_scale(self, job_id: str, now: float) -> float | None:
        """Throughput physics has no gradient noise: nothing to report (``NoiseReporter``)."""
        return None
