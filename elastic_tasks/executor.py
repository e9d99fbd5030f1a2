"""``DaskExecutor``: the allocator loop's Executor protocol, on real elastic jobs.

Every job of the loop becomes a ``JobCoordinator``; ``apply`` turns the allocation change
into starts, in-place rescales and stops, shrinking and stopping first so the workers they
free are there for the jobs that grow. Events carry the pause the ranks measured.
Times are seconds since the executor's clock started (the loop's times).

Each running job's gradient noise scale (the trainer's smoothed estimate, from its latest
status) goes to the loop as a ``NoiseReporter``, so a goodput policy decides on what the job
measured.

Each running job's throughput model is refitted from the steps it runs (``refit_watch``: its
status reports, its offline profile the prior) and goes to the loop as a ``ProfileReporter``,
so every policy decides on the job's measured step times; ``refit=None`` turns that off.

Placement never fails a job. The policy plans on the GPUs alive; the workers a start takes
are the ones free *now*, and a job that is finishing keeps its workers until it is collected
(its shrink is skipped: it is ending). A start that finds fewer free workers than planned first
collects the jobs whose ranks already finished (their workers are what it was planned onto),
and if that is not enough it waits: the job keeps its planned share in the loop (it shows as
starting), ``waiting_starts`` asks the loop to decide again, and every ``apply`` tries the start
again until the workers are there. A grow that finds too few free workers (a plan that counted
on a worker another job still holds) waits the same way: the job trains on at its size
(``in_effect`` says so) and every ``apply`` tries the grow again.

Units of work (one physics, ``allocator.physics.choice``). A job that carries a ``noise_scale``, and
every job under a ``noise_model`` (the goodput policy the loop runs, e.g. ``goodput_dp``),
counts base-batch-equivalent samples, as in the goodput simulator
(``allocator.simulator.goodput_executor``) and as the policy assumes: a sample at global batch
B is worth E(B) = (B_noise + B0) / (B_noise + B). Any other job's ``total_samples`` are raw
samples: the trainer stops after that many, and progress is its ``samples_seen``. A metered job's
* progress is a ``WorkMeter`` fed with the trainer's counters, batch and the B_noise the
  policy itself would use (``noise_model.noise_scale``: the measured value, else its model;
  without a noise model ``SpecNoise``: the measured value, else the job's own trajectory);
* the trainer is given ``raw_sample_budget`` raw samples, the most the work can take at any
  batch in the job's range, and the executor stops the job itself once the meter reaches
  ``total_samples`` (so a job overruns by at most what trains between two polls, ``poll_s``,
  plus the stop; a job that reaches the raw budget first has done its work too).
The value of a sample is a model: at a fixed noise scale it is McCandlish et al.'s, and the
estimate it uses is the trainer's own. A resumed job (service restart) counts the samples of
its checkpoint at the value of its first report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from distributed import Client

from allocator.loop.execution import JobFailure, share_changes
from allocator.physics.goodput import NoiseModel, SpecNoise, WorkMeter, raw_sample_budget
from allocator.physics.throughput import throughput
from allocator.wall_split import WallSplit, job_split
from allocator.types import Allocation, JobSpec, MeasuredTable, RescaleEvent, RescaleKind, Share, ThroughputProfile
from elastic_tasks.cluster import NoFreeWorkers, WorkerPool
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.coordinator.outcomes import JobResult
from elastic_tasks.coordinator.packing import host_of
from elastic_tasks.protocol import PlanKind, TrainConfig
from elastic_tasks.coordinator.refit_watch import JobRefit, RefitSettings
from elastic_tasks.tracked_job import TrackedJob


class WallClock:
    """Real time since construction; ``sleep_until`` sleeps."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)


@dataclass(frozen=True, slots=True)
class JobSettings:
    """What the executor adds to a JobSpec to train it; ``poll_s`` bounds how late a completion is seen."""

    timeout_s: float = 30.0  # control plane: rendezvous, plans, a lost peer (TrainConfig.timeout_s)
    seed: int = 0
    checkpoint_root: str | None = None
    checkpoint_every: int = 0
    lr_ramp_steps: int = 100
    poll_s: float = 0.5
    data_timeout_s: float = 600.0  # data plane: one gradient allreduce or state broadcast

    def __post_init__(self) -> None:
        if not (self.poll_s > 0):
            raise ValueError(f"JobSettings.poll_s={self.poll_s!r}: must be > 0")


class DaskExecutor:
    def __init__(
        self,
        client: Client,
        entrypoints: Mapping[str, str] | Callable[[JobSpec], str],
        settings: JobSettings = JobSettings(),
        *,
        clock: WallClock | None = None,
        noise_model: NoiseModel | None = None,
        refit: RefitSettings | None = RefitSettings(),
        build_recipe_here: bool = True,
    ) -> None:
        """``build_recipe_here``: each job's coordinator builds its recipe here before starting ranks
        (``JobCoordinator``); False leaves that to the ranks (the service: no torch in its process)."""
        self.build_recipe_here, self.client = build_recipe_here, client
        self.pool = WorkerPool(client, grace_s=settings.timeout_s)  # a dropped rank ends within the control timeout
        self._entry = entrypoints
        self.settings = settings
        self.clock = clock or WallClock()
        self.noise_model, self.refit = noise_model, refit
        self._tracked: dict[str, TrackedJob] = {}

    @property
    def jobs(self) -> dict[str, JobCoordinator]:
        """Each job started here: its coordinator (a read-only view)."""
        return {j: t.coordinator for j, t in self._tracked.items() if t.coordinator is not None}

    @property
    def results(self) -> dict[str, JobResult]:
        """Each job whose ranks' results were collected (a read-only view)."""
        return {j: t.result for j, t in self._tracked.items() if t.result is not None}

    def result(self, job_id: str) -> JobResult | None:
        """The job's collected result, or None (bind this, not ``results.get``: a view per read)."""
        t = self._tracked.get(job_id)
        return t.result if t is not None else None

    def _get(self, job_id: str) -> TrackedJob:
        return self._tracked.setdefault(job_id, TrackedJob())

    def entrypoint(self, spec: JobSpec) -> str:
        if callable(self._entry):
            return self._entry(spec)
        try:
            return self._entry[spec.workload]
        except KeyError:
            raise ValueError(f"job {spec.id!r}: workload={spec.workload!r} has no entry point (known: {sorted(self._entry)})") from None

    def _config(self, spec: JobSpec, share: Share) -> TrainConfig:
        s = self.settings
        return TrainConfig(
            global_batch=share.global_batch,
            total_samples=raw_sample_budget(spec) if self._meters_work(spec) else spec.total_samples,
            seed=s.seed if spec.seed is None else spec.seed,
            max_batch_per_gpu=spec.profile.max_batch_per_gpu,
            lr_ramp_steps=s.lr_ramp_steps,
            checkpoint_dir=None if s.checkpoint_root is None else f"{s.checkpoint_root}/{spec.id}",
            checkpoint_every=s.checkpoint_every if s.checkpoint_root is not None else 0,
            timeout_s=s.timeout_s,
            data_timeout_s=s.data_timeout_s,
        )

    def _meters_work(self, spec: JobSpec) -> bool:
        """Base-batch-equivalent work: under a goodput policy, or for a job with a noise scale."""
        return self.noise_model is not None or spec.noise_scale is not None

    def apply(self, now: float, previous: Allocation, new: Allocation, jobs: Mapping[str, JobSpec]) -> list[RescaleEvent]:
        changes = share_changes(previous, new)
        # Free workers before taking any: stops, then shrinks, then grows and starts.
        changes.sort(key=lambda c: (c[2] is not None, c[1] is None, (c[2].gpus - c[1].gpus) if c[1] and c[2] else 0))
        changed = {job_id for job_id, _, _ in changes}
        # Starts and grows that waited for workers and whose share did not change: try them again, last.
        retries = [
            (job_id, t.share_now(), share)
            for job_id, t in list(self._tracked.items())
            if t.waiting is not None and job_id not in changed and (share := new.get(job_id)) is not None
        ]
        events = []
        for job_id, before, after in [*changes, *retries]:
            t = self._tracked.get(job_id)
            if t is not None and (t.failure is not None or (t.coordinator is not None and t.coordinator.finished)):
                continue
            try:
                event = self._change(now, job_id, before, after, jobs)
            except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the others
                self._fail(job_id, f"{type(exc).__name__}: {exc}")
                continue
            if event is not None:
                events.append(event)
        return events

    def preempt(self, job_id: str) -> None:
        """The loop takes the job off the cluster to give its GPUs to another team (``Preempter``):
        its stop saves a checkpoint first, so that it resumes where it stopped when admitted again."""
        if job_id in self._tracked:
            self._tracked[job_id].preempted = True

    def waiting_starts(self, now: float) -> tuple[str, ...]:
        """Jobs whose planned start or grow waits for free workers (the loop decides again while any do)."""
        return tuple(j for j, t in self._tracked.items() if t.waiting is not None and t.failure is None)

    def _free_for_start(self, n: int) -> bool:
        """At least ``n`` free workers, after collecting jobs whose ranks finished but still hold theirs."""
        if len(self.pool.free()) >= n:
            return True
        for t in self._tracked.values():
            if t.coordinator is not None and t.coordinator.finished and t.result is None and not t.reported:
                t.result = t.coordinator.collect()  # ``completed`` reports it at its next poll
        return len(self.pool.free()) >= n

    def _change(self, now: float, job_id: str, before: Share | None, after: Share | None, jobs: Mapping[str, JobSpec]) -> RescaleEvent | None:
        t = self._get(job_id)
        job = t.coordinator
        if after is None:
            t.waiting = None
            if job is not None:
                job.stop(checkpoint=t.preempted)
                t.preempted = False
                # Wait for the ranks to leave: the freed workers are what the next start takes.
                t.result, t.reported = job.collect(), True
            return RescaleEvent(now, job_id, before, None, RescaleKind.STOP, 0.0, measured=True)
        if job is None or before is None:
            if not self._free_for_start(after.gpus):
                t.waiting = after
                return None
            t.waiting = None
            spec = jobs[job_id]
            if self._meters_work(spec):
                t.meter = WorkMeter(spec)
            if self.refit is not None:
                # A restarted job keeps what it measured before; its new coordinator counts versions from 0.
                if t.refit is None:
                    t.refit = JobRefit(spec.profile, self.refit)
                t.refit.watch.restart()
            if t.launched_at is None:
                t.launched_at = time.time()
            if t.result is not None:
                # Stopped earlier, started again: live again, its end still to be reported, and its
                # result is the new run's (it resumes from the checkpoint the stop left).
                t.samples_before, t.result, t.reported = float(t.result.samples_seen), None, False
            t.coordinator = JobCoordinator(
                self.client, self.pool, job_id, self.entrypoint(spec), self._config(spec, after), build_recipe_here=self.build_recipe_here
            )
            outcome = t.coordinator.start(after.gpus, after.global_batch, after.accum_steps)
            return RescaleEvent(now, job_id, None, after, RescaleKind.START, outcome.pause_s, measured=True)
        try:
            outcome = job.rescale(after.gpus, after.global_batch, accum_steps=after.accum_steps)
        except NoFreeWorkers:
            # Nothing was taken or published: the job trains on at its size, the grow waits.
            t.waiting = after
            return None
        t.waiting = None
        if outcome is None:
            return None  # the job ended first: nothing was rescaled, its completion frees it
        kind = RescaleKind.BATCH if outcome.kind == PlanKind.BATCH else RescaleKind.IN_PLACE
        return RescaleEvent(now, job_id, before, after, kind, outcome.pause_s, measured=True)

    def _fail(self, job_id: str, reason: str) -> None:
        t = self._get(job_id)
        t.failure, t.waiting = reason, None
        if t.coordinator is not None:
            t.coordinator.abandon()
        else:
            self.pool.give_back([w for w, owner in self.pool.busy.items() if owner == job_id])

    def failed(self, now: float) -> list[JobFailure]:
        for job_id, t in list(self._tracked.items()):
            if t.live and not t.coordinator.finished:  # type: ignore[union-attr]
                reason = t.coordinator.failure()  # type: ignore[union-attr]
                if reason is not None:
                    self._fail(job_id, reason)
        out = [JobFailure(j, t.failure) for j, t in self._tracked.items() if t.failure is not None and not t.reported]
        for f in out:
            self._tracked[f.job_id].reported = True
        return out

    def in_effect(self, allocation: Allocation) -> Allocation:
        shares = []
        jobs = self.jobs  # built per call: once, not per share (the loop asks at every wake)
        for job_id, share in allocation.shares:
            job = jobs.get(job_id)
            gpus = job.world_size if job is not None and 0 < job.world_size < share.gpus else share.gpus
            shares.append((job_id, share if gpus == share.gpus else Share(gpus, max(share.global_batch, gpus))))
        return Allocation(tuple(shares))

    def suspend_all(self, timeout: float | None = None) -> dict[str, bool]:
        """Checkpoint and stop every running job (a service shutting down): job -> checkpoint saved."""
        saved = {}
        for job_id, t in self._tracked.items():
            job = t.coordinator
            if job is not None and not t.reported and not job.finished and job.members:
                try:
                    saved[job_id] = job.suspend(timeout)
                except Exception:  # noqa: BLE001 - shutting down: the next job still gets its chance
                    saved[job_id] = False
                t.reported = True
        return saved

    def _status(self, job_id: str):  # type: ignore[no-untyped-def]
        """The job's latest status while its end is unreported (None otherwise, or before its first step)."""
        t = self._tracked.get(job_id)
        return t.coordinator.status() if t is not None and t.coordinator is not None and not t.reported else None

    def noise_scale(self, job_id: str, now: float) -> float | None:
        """The job's smoothed B_noise from its latest status (None: not running or not estimated yet)."""
        status = self._status(job_id)
        ok = status is not None and status.noise_scale is not None and status.noise_scale > 0
        return status.noise_scale if ok else None  # an odd report (an older rank's 0.0, a nan): "not estimated", never a stopped scheduler

    def _watch(self, job_id: str, t: TrackedJob) -> None:
        """Feed the job's refit its latest status, with the hosts its workers span now."""
        assert t.coordinator is not None and t.refit is not None
        held = [addr for addr, owner in self.pool.busy.items() if owner == job_id]
        status = t.coordinator.status()
        hosts = len({host_of(a) for a in held}) if status is not None and len(held) == status.world_size else None
        t.refit.observe(status, hosts)

    def profile(self, job_id: str, now: float) -> ThroughputProfile | None:
        """The job's throughput model refitted from its own steps (None: not running, refit off, no step yet)."""
        t = self._tracked.get(job_id)
        if t is None or t.refit is None or not t.live:
            return None
        self._watch(job_id, t)
        return t.refit.profile()

    def measured(self, job_id: str, now: float) -> MeasuredTable | None:
        """What the job measured per configuration (``allocator.profiles.measured``; None: refit off or nothing timed).
        Kept across a restart of the job, like its refit: the configurations are the same."""
        t = self._tracked.get(job_id)
        return t.refit.measured() if t is not None and t.refit is not None and not t.reported and t.failure is None else None

    def wall_split(self, job_id: str, submitted: float | None, end: float) -> WallSplit | None:
        """Where the job's wall time [submitted, end] (epoch seconds) went, from its ranks' timelines
        (``allocator.wall_split``; None: no result collected, or never started here)."""
        t = self._tracked.get(job_id)
        if t is None or t.result is None or t.launched_at is None:
            return None
        return job_split([r.wall for r in t.result.ranks], t.launched_at, end, submitted)

    def predicted_rate(self, job_id: str, share: Share) -> float | None:
        """The samples/s the job's current model (its refit, else its profile) predicts for ``share``."""
        refit = self._tracked[job_id].refit if job_id in self._tracked else None
        return None if refit is None else float(throughput(refit.profile() or refit.prior, share.global_batch, share.gpus, share.accum_steps))

    def measured_rate(self, job_id: str, share: Share) -> float | None:
        """The samples/s the job's latest generation measured, if it ran ``share``'s GPUs and batch."""
        refit = self._tracked[job_id].refit if job_id in self._tracked else None
        return refit.generation_rate(share.gpus, share.global_batch) if refit is not None else None

    def _metered(self, job_id: str, t: TrackedJob) -> float:
        """Feed the job's meter its latest status; the base-batch-equivalent samples done."""
        meter = t.meter
        assert meter is not None
        status = self._status(job_id)
        if status is not None:
            noise = (self.noise_model or SpecNoise()).noise_scale(meter.spec, meter.done, status.noise_scale)
            meter.observe(status.step, status.samples_seen, status.global_batch, noise)
        return meter.done

    def progress(self, job_id: str, now: float) -> float:
        t = self._tracked.get(job_id)
        if t is None:
            return 0.0
        if t.meter is not None:
            return self._metered(job_id, t)
        if t.result is not None:
            return float(t.result.samples_seen)
        status = t.coordinator.status() if t.coordinator is not None else None
        return float(status.samples_seen) if status is not None else t.samples_before

    def completed(self, now: float) -> list[str]:
        done = []
        for job_id, t in self._tracked.items():
            job = t.coordinator
            if job is None or not t.live:
                continue
            if t.refit is not None and job.members:
                self._watch(job_id, t)  # every poll: a generation's reports are seen before it ends
            if job.finished:
                if t.result is None:  # a start that needed its workers collected it already
                    t.result = job.wait(timeout=60)
            elif t.meter is not None and job.members and self._metered(job_id, t) >= t.meter.spec.total_samples:
                job.stop()  # its base-batch-equivalent work is done; the trainer's raw budget is an upper bound
                t.result = job.collect()
            else:
                continue
            t.reported, t.waiting = True, None  # a grow it waited for is moot
            done.append(job_id)
        return done

    def next_completion(self, now: float) -> float | None:
        """Not known exactly: wake up every ``poll_s`` while anything runs to notice completions."""
        running = any(t.live and t.coordinator.members for t in self._tracked.values())  # type: ignore[union-attr]
        waiting = any(t.waiting is not None for t in self._tracked.values())
        return now + self.settings.poll_s if running or waiting else None

    def close(self) -> None:
        for t in self._tracked.values():
            if t.coordinator is not None and not t.reported:
                t.coordinator.stop()
                t.coordinator.close()
