"""A modelled cluster whose jobs progress by goodput: base-batch-equivalent samples per second.

Every policy is judged on the same physics: a job running a share (k GPUs, global batch B,
s accumulation steps) advances at T(B, k, s) x E(B) base-batch-equivalent samples per second,
where E follows the job's gradient-noise-scale trajectory over its progress
(``allocator.physics.goodput``). The trajectory is piecewise constant in progress, so the rate is
constant within each piece and finish times are exact sums over pieces. A job finishes
when it has done its ``work_samples`` (its declared ``total_samples`` unless a simulation gives
``actual_samples``) base-batch-equivalent samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from allocator.physics.goodput import NoiseTrajectory, base_batch, efficiency, step_time
from allocator.loop import LoopResult, LoopSettings, StepReport, run_loop
from allocator.policies.base import Policy
from allocator.simulator.clock import SimClock
from allocator.simulator.executor import RescaleCost, change_cost_s, classify
from allocator.simulator.modelled import ModelledCluster
from allocator.types import JobSpec, RescaleKind, Share


@dataclass(slots=True)
class _Job:
    spec: JobSpec
    trajectory: NoiseTrajectory
    rate_for: Callable[[Share], list[float]]  # the executor's physics for this job
    done: float = 0.0  # base-batch-equivalent samples as of ``since``
    since: float = 0.0
    paused_until: float = 0.0
    rates: list[float] = field(default_factory=list)  # per trajectory piece; empty: not running
    version: int = 0
    finished: bool = False

    def run(self, share: Share | None) -> None:
        self.rates = self.rate_for(share) if share is not None else []

    def _pieces(self) -> Iterable[tuple[float, float]]:
        """(end of piece in samples, rate) for the pieces from the current progress on."""
        total = float(self.spec.work_samples)
        for end, rate in zip(self.trajectory.bounds[1:], self.rates):
            end_samples = end * total
            if end_samples > self.done:
                yield end_samples, rate

    def progress_at(self, t: float) -> float:
        left = max(0.0, t - max(self.since, self.paused_until))
        done = self.done
        for end, rate in self._pieces():
            if rate <= 0 or left <= 0:
                break
            need = (end - done) / rate
            if left < need:
                return done + rate * left
            done, left = end, left - need
        return min(done, float(self.spec.work_samples))

    def settle(self, t: float) -> None:
        self.done = self.progress_at(t)
        self.since = max(t, self.since)

    def finish_time(self) -> float | None:
        if not self.rates:
            return None
        t, done = max(self.since, self.paused_until), self.done
        for end, rate in self._pieces():
            if rate <= 0:
                return None
            t, done = t + (end - done) / rate, end
        return t


class GoodputSimExecutor(ModelledCluster[_Job]):
    """Same protocol as ``SimExecutor``; progress is in base-batch-equivalent samples.

    With ``report_noise`` every job reports its trajectory's B_noise at its current progress as
    if it had measured it exactly (``NoiseReporter``), as the real trainer reports its estimate;
    then a goodput policy sees the true physics whatever its own model. Off by default: the
    policy decides on its own trajectories, as the simulations so far did.
    """

    def __init__(
        self,
        noise: Mapping[str, NoiseTrajectory],
        default_cost: RescaleCost = RescaleCost(),
        gpus_per_host: int | None = None,
        default_noise_scale: float = math.inf,
        report_noise: bool = False,
    ) -> None:
        super().__init__()
        self._noise = dict(noise)
        self._report_noise = report_noise
        self._default_noise = NoiseTrajectory.constant(default_noise_scale)
        self._cost = default_cost
        self._per_host = gpus_per_host

    def trajectory(self, spec: JobSpec) -> NoiseTrajectory:
        """``noise`` by job id or workload, else the job's own ``noise_scale``, else the default."""
        return self._noise.get(spec.id) or self._noise.get(spec.workload) or spec.noise_scale or self._default_noise

    def rates(self, spec: JobSpec, share: Share) -> list[float]:
        """Goodput of ``share`` in each piece of the job's noise trajectory."""
        step = step_time(spec, share.global_batch, share.gpus, share.accum_steps, self._per_host)
        if not math.isfinite(step):
            return [0.0] * len(self.trajectory(spec).values)
        b0 = base_batch(spec)
        return [share.global_batch / step * float(efficiency(v, b0, share.global_batch)) for v in self.trajectory(spec).values]

    def _new_job(self, spec: JobSpec, now: float) -> _Job:
        return _Job(spec, self.trajectory(spec), since=now, paused_until=now, rate_for=lambda share: self.rates(spec, share))

    def _change_cost(self, job_id: str, before: Share | None, after: Share | None, resumed: bool = False) -> tuple[RescaleKind, float]:
        return classify(before, after, self._cost, resumed)

    def change_cost(self, job_id: str) -> float:
        """What a GPU-count change costs a job (``ChangeCostReporter``): the run's one cost."""
        return change_cost_s(self._cost)

    def noise_scale(self, job_id: str, now: float) -> float | None:
        """The job's modelled B_noise at its progress by ``now`` (only with ``report_noise``)."""
        state = self._jobs.get(job_id)
        if not self._report_noise or state is None:
            return None
        return state.trajectory.at(self.progress(job_id, now) / state.spec.work_samples)


def simulate_goodput(
    jobs: Iterable[JobSpec],
    policy: Policy,
    capacity: int,
    noise: Mapping[str, NoiseTrajectory],
    settings: LoopSettings = LoopSettings(),
    cost: RescaleCost = RescaleCost(),
    gpus_per_host: int | None = None,
    observer: Callable[[StepReport], None] | None = None,
    report_noise: bool = False,
) -> LoopResult:
    """The shared loop on goodput physics; ``noise`` is keyed by job id or workload name.

    ``report_noise``: jobs report their true B_noise to the policy, as real jobs report their
    estimate (``GoodputSimExecutor``)."""
    executor = GoodputSimExecutor(noise, cost, gpus_per_host, report_noise=report_noise)
    return run_loop(jobs, policy, capacity, SimClock(), executor, settings, observer)
