"""A running job's measured steps, refitted into its throughput model (``allocator.profiles.refit``).

The executor reads each job's status now and then (``JobCoordinator.status``: rank 0's step
counter, world size, global batch, plan version and the wall time it recorded its latest step).
Two reports of one generation (plan version), n steps apart, say that those n steps took
``(t2 - t1) / n`` seconds each: n ``StepObservation``s of that mean (one per step, so the
prior fades by steps reported, as ``OnlineThroughputFit`` says; one shared frozen instance, so
a step costs the list a reference), on the generation's GPUs, the micro-batch and accumulation
steps the ranks reported running (the policy's ``Share.accum_steps``, passed whole in the plan)
and the hosts its workers span. Reports come every 0.5 s or so (the rank's
courier): the steps between two are timed together.

The job's offline profile is the fit's prior; once the job has reported steps its own
measurements decide (``OnlineThroughputFit``). Allreduce coefficients the job has not
measured (it never ran on several GPUs of one host, or across hosts) stay the prior's: a
one-GPU job says nothing about its allreduce, and a zero fit would tell the policy that
scaling out is free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from allocator.profiles.measured_types import MeasuredRate, MeasuredTable
from allocator.profiles.refit import OnlineThroughputFit, StepObservation
from allocator.types import ThroughputProfile
from elastic_tasks.board import JobStatus


@dataclass(frozen=True, slots=True)
class RefitSettings:
    """``warmup_steps``: steps skipped after the first report of each generation (see ``StepWatch``);
    ``half_life``: ``OnlineThroughputFit``'s forgetting, in observations (None: never forget)."""

    warmup_steps: int = 3
    half_life: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(f"RefitSettings.warmup_steps={self.warmup_steps!r}: must be an integer >= 0")
        if self.half_life is not None and not (self.half_life > 0):
            raise ValueError(f"RefitSettings.half_life={self.half_life!r}: must be > 0 or None")


class StepWatch:
    """Turns one job's successive status reports into ``StepObservation``s (pure: no clock, no I/O).

    Warm-up: the first steps after a start or a rescale are slow (the new process group's first
    collectives, the data loader restarting, allocator caches; ``benchmarks/refit_bench.py``
    drops 3). So the first report of a generation is never the end of an interval — the time
    before it holds the regroup pause — and intervals start only at the first report at least
    ``warmup_steps`` steps after it. A report whose hosts are unknown (the executor's workers do
    not match its world size: a generation in transition) ends no interval either.
    """

    def __init__(self, warmup_steps: int = 3) -> None:
        self.warmup_steps = warmup_steps
        self.restart()

    def restart(self) -> None:
        """A new coordinator (the job restarted): plan versions count from 0 again."""
        self._version: int | None = None
        self._first_step = 0
        self._last: JobStatus | None = None  # the open interval's start (None: still warming up)

    def observe(self, status: JobStatus | None, hosts: int | None) -> list[StepObservation]:
        if status is None:
            return []
        if status.version != self._version:
            self._version, self._first_step, self._last = status.version, status.step, None
            return []
        if self._last is None:
            if status.step >= self._first_step + self.warmup_steps:
                self._last = status
            return []
        last = self._last
        if status.step <= last.step or status.time <= last.time:
            return []  # the same report again (polled faster than the rank pushes)
        self._last = status
        if hosts is None or status.world_size != last.world_size or status.global_batch != last.global_batch or status.accum_steps != last.accum_steps:
            return []
        k, batch = status.world_size, status.global_batch
        accum = status.accum_steps  # what the ranks ran (the policy's, passed whole in the plan)
        steps = status.step - last.step
        return [StepObservation(k, -(-batch // (k * accum)), accum, min(hosts, k), (status.time - last.time) / steps)] * steps


class JobRefit:
    """One job's online model: its status reports in, a refitted ``ThroughputProfile`` out."""

    def __init__(self, prior: ThroughputProfile, settings: RefitSettings = RefitSettings()) -> None:
        self.prior = prior
        self.watch = StepWatch(settings.warmup_steps)
        self.fit = OnlineThroughputFit(prior.num_params, prior=prior, half_life=settings.half_life)
        self.observations = 0
        self._intra_seen = self._inter_seen = False
        self._profile: ThroughputProfile | None = None
        self._fitted_at = 0
        # Per configuration (GPUs, global batch, accumulation) and per generation (the run's
        # count of plan versions seen): [samples, seconds, steps] over the steps timed there.
        self._rates: dict[tuple[int, int, int], list[float]] = {}
        self._generations: list[list[float]] = []
        self._version: int | None = None

    def observe(self, status: JobStatus | None, hosts: int | None) -> None:
        new = self.watch.observe(status, hosts)
        if status is not None and status.version != self._version:
            self._version = status.version
            self._generations.append([0.0, 0.0, 0, status.world_size, status.global_batch])
        if new and status is not None:
            o, n = new[0], len(new)
            for acc in (self._rates.setdefault((o.gpus, status.global_batch, o.accum_steps), [0.0, 0.0, 0]), self._generations[-1]):
                acc[0] += status.global_batch * n
                acc[1] += o.seconds * n
                acc[2] += n
        self.fit.add(new)
        self.observations += len(new)
        self._intra_seen |= any(o.gpus > 1 and o.hosts == 1 for o in new)
        self._inter_seen |= any(o.gpus > 1 and o.hosts > 1 for o in new)

    def measured(self) -> MeasuredTable | None:
        """The samples/s the job's timed steps ran at, per configuration (None: none timed yet)."""
        rates = tuple(MeasuredRate(k, b, a, acc[0] / acc[1], int(acc[2])) for (k, b, a), acc in self._rates.items() if acc[2] > 0 and acc[1] > 0)
        return MeasuredTable(rates) if rates else None

    def generation_rate(self, gpus: int, batch: int) -> float | None:
        """Samples/s over the timed steps of the latest generation seen, if it ran ``gpus`` x ``batch``
        (None: it ran another shape — the one asked about is not reported yet — or none was timed)."""
        if not self._generations:
            return None
        samples, seconds, steps, k, b = self._generations[-1]
        return samples / seconds if steps > 0 and seconds > 0 and (k, b) == (gpus, batch) else None

    def profile(self) -> ThroughputProfile | None:
        """The refitted profile (None until the job has reported a step past its warm-up)."""
        if self.observations == 0:
            return None
        if self._fitted_at != self.observations:
            p = self.prior
            fitted = self.fit.fit().to_profile(p.workload, p.num_params, p.max_batch_per_gpu, hardware=f"{p.hardware} (refitted)")
            self._profile = dataclasses.replace(
                fitted,
                allreduce=fitted.allreduce if self._intra_seen else p.allreduce,
                inter_host=fitted.inter_host if self._inter_seen else p.inter_host,
            )
            self._fitted_at = self.observations
        return self._profile
