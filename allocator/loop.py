"""The one autoscaling loop (seed 000, Fig. 4), for simulated and real clusters alike.

Jobs arrive into a buffer; every Δ (and, if asked, on each arrival or completion) the loop
takes a snapshot, admits what fits (dropping or queueing the rest), asks the policy for an
allocation and hands the change to an executor. Only the clock and the executor differ
between a simulation (``SimClock`` + ``SimExecutor``) and a real run (a wall clock + the
Dask executor in ``elastic_tasks``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from allocator.admission import OverflowMode, admit, reallocate
from allocator.execution import Clock, Executor, reported_measurements, reported_noise_scale, reported_profile, waiting_starts
from allocator.goodput import NoiseModel
from allocator.lifecycle import JobState
from allocator.measured import TrustSettings, Value, goodput_value, rate_value, trust_measurements, would_revert
from allocator.policies.base import Policy
from allocator.sources import EPS, JobSource, StaticJobs
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, RescaleEvent, RunningJob

@dataclass(frozen=True, slots=True)
class LoopSettings:
    """How the loop decides.

    ``interval_s`` is seed 000's Δ. With ``react_to_events`` the loop also re-allocates as
    soon as a job arrives or finishes (the seed's simulator does); without it, changes wait
    for the next tick (the seed's real autoscaler does). ``horizon_s`` stops the run early.
    """

    interval_s: float = 600.0
    overflow: OverflowMode = OverflowMode.QUEUE
    strict_fifo: bool = True
    react_to_events: bool = True
    horizon_s: float | None = None
    trust: TrustSettings | None = TrustSettings()  # None: the policy's answer as is, measurements or not

    def __post_init__(self) -> None:
        if not (self.interval_s > 0):
            raise ValueError(f"LoopSettings.interval_s={self.interval_s!r}: must be > 0")
        if self.horizon_s is not None and not (self.horizon_s > 0):
            raise ValueError(f"LoopSettings.horizon_s={self.horizon_s!r}: must be > 0")
        object.__setattr__(self, "overflow", OverflowMode(self.overflow))


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """From ``time`` on, ``job_id`` runs on ``gpus`` GPUs with global ``batch`` in ``accum_steps``
    micro-steps per optimizer step (0/0: not running; accumulation then reads 1)."""

    time: float
    job_id: str
    gpus: int
    batch: int
    accum_steps: int = 1


@dataclass(frozen=True, slots=True)
class JobTransition:
    """A job entered ``phase`` at ``time`` (``detail``: why it failed or was dropped)."""

    time: float
    job_id: str
    phase: JobState
    detail: str = ""


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    arrival: float
    start: float | None
    finish: float | None
    dropped: bool
    samples_done: float
    failed: str | None = None  # the reason, for a job the executor gave up on
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one decision did; passed to the observer (progress bars, live logging)."""

    time: float
    allocation: Allocation
    events: tuple[RescaleEvent, ...]
    admitted: tuple[str, ...]
    dropped: tuple[str, ...]
    queued: int
    finished_total: int
    jobs_total: int


@dataclass(frozen=True, slots=True)
class LoopResult:
    policy: str
    capacity: int
    settings: LoopSettings
    end_time: float
    schedule: tuple[ScheduleRow, ...]
    events: tuple[RescaleEvent, ...]
    jobs: tuple[JobRecord, ...]
    gpu_usage: tuple[tuple[float, int], ...]
    decisions: int

    def record(self, job_id: str) -> JobRecord:
        for r in self.jobs:
            if r.job_id == job_id:
                return r
        raise KeyError(job_id)


@dataclass
class _Tracking:
    """The loop's private bookkeeping (never leaves this module; results are frozen copies)."""

    arrival: dict[str, float] = field(default_factory=dict)
    start: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)
    schedule: list[ScheduleRow] = field(default_factory=list)
    events: list[RescaleEvent] = field(default_factory=list)
    usage: list[tuple[float, int]] = field(default_factory=list)


def _fits_alone(job: JobSpec, capacity: int, policy: Policy, time: float) -> bool:
    """Could the job ever run, on an otherwise empty cluster? If not, queueing it is pointless."""
    return bool(admit(ClusterSnapshot(time=time, capacity=capacity, queued=(job,)), policy, OverflowMode.DROP).admitted)


def _record_changes(track: _Tracking, now: float, previous: Allocation, new: Allocation) -> None:
    for job_id, share in new.shares:
        if previous.get(job_id) != share:
            track.schedule.append(ScheduleRow(now, job_id, share.gpus, share.batch, share.accum_steps))
    for job_id, _ in previous.shares:
        if job_id not in new:
            track.schedule.append(ScheduleRow(now, job_id, 0, 0))
    _record_usage(track, now, new.total_gpus)


def _record_usage(track: _Tracking, now: float, gpus: int) -> None:
    if track.usage and track.usage[-1][0] == now:
        track.usage[-1] = (now, gpus)  # several changes at one instant: keep the last
    elif not track.usage or track.usage[-1][1] != gpus:
        track.usage.append((now, gpus))


def _as_measured(spec: JobSpec, executor: Executor, now: float) -> JobSpec:
    """The running job's spec with the profile the executor refitted from its steps, if any."""
    profile = reported_profile(executor, spec.id, now)
    return spec if profile is None else dataclasses.replace(spec, profile=profile)


def _noise_moved(policy: Policy, running: dict[str, JobSpec], executor: Executor, now: float, decided: dict[str, float]) -> bool:
    """Did the noise scale a noise-aware policy sees for a running job change since its last decision?"""
    if not isinstance(policy, NoiseModel):
        return False
    for job_id, spec in running.items():
        seen = policy.noise_scale(spec, executor.progress(job_id, now), reported_noise_scale(executor, job_id, now))
        if seen != decided.get(job_id):
            return True
    return False


def _value(policy: Policy) -> Value:
    """How the measured-rate adapter compares batches: as the policy does (goodput or samples/s)."""
    return goodput_value(policy) if isinstance(policy, NoiseModel) else rate_value


def _running_now(running: dict[str, JobSpec], allocation: Allocation, executor: Executor, now: float) -> tuple[RunningJob, ...]:
    return tuple(
        RunningJob(_as_measured(spec, executor, now), allocation.get(j), executor.progress(j, now), reported_noise_scale(executor, j, now), reported_measurements(executor, j, now))
        for j, spec in running.items()
    )


def _remove(allocation: Allocation, job_id: str) -> Allocation:
    return Allocation(tuple(p for p in allocation.shares if p[0] != job_id))


def run_loop(
    jobs: Iterable[JobSpec] | JobSource,
    policy: Policy,
    capacity: int | Callable[[], int],
    clock: Clock,
    executor: Executor,
    settings: LoopSettings = LoopSettings(),
    observer: Callable[[StepReport], None] | None = None,
    on_job: Callable[[JobTransition], None] | None = None,
) -> LoopResult:
    """Run jobs to completion (or the horizon, or a stop from the source) under ``policy``.

    ``jobs`` is a fixed list (each arrives at its ``arrival_time``) or a live ``JobSource``.
    ``capacity`` is a GPU count, or a function giving the GPUs alive now: then a change is a
    reason to decide again, and a job larger than the cluster waits (workers may join) rather
    than being dropped at arrival. ``on_job`` hears every job's phase changes as they happen.
    """
    if hasattr(jobs, "poll"):
        source: JobSource = jobs  # type: ignore[assignment]
        specs: dict[str, JobSpec] = {}
    else:
        listed = list(jobs)
        specs = {j.id: j for j in listed}
        source = StaticJobs(listed)
    dynamic = callable(capacity)
    cap = capacity() if dynamic else capacity  # type: ignore[operator]
    peak = cap
    waiting: list[JobSpec] = []
    running: dict[str, JobSpec] = {}
    allocation = Allocation()
    track = _Tracking()
    start_time = clock.now()
    next_tick = start_time
    dirty = False
    decisions = 0
    decided_noise: dict[str, float] = {}  # each running job's noise scale, as a noise-aware policy saw it at its last decision

    def tell(now: float, job_id: str, phase: JobState, detail: str = "") -> None:
        if on_job is not None:
            on_job(JobTransition(now, job_id, phase, detail))

    def end_running(now: float, job_id: str) -> None:
        """A running job left (finished, failed): its GPUs are free at once, decision or not."""
        nonlocal allocation
        del running[job_id]
        track.schedule.append(ScheduleRow(now, job_id, 0, 0))
        allocation = _remove(allocation, job_id)
        _record_usage(track, now, allocation.total_gpus)

    while True:
        now = clock.now()
        update = source.poll(now)
        for job in update.jobs:
            specs[job.id] = job
            track.arrival[job.id] = job.arrival_time
            if dynamic or _fits_alone(job, cap, policy, now):
                waiting.append(job)
                tell(now, job.id, JobState.QUEUED)
            else:
                track.dropped.add(job.id)  # larger than the whole cluster: would wait forever
                tell(now, job.id, JobState.DROPPED, f"needs more than the cluster's {cap} GPUs")
            dirty = True
        for job_id in update.cancelled:
            if job_id in running:
                new = _remove(allocation, job_id)
                track.events.extend(executor.apply(now, allocation, new, specs))
                _record_changes(track, now, allocation, new)
                allocation = new
                del running[job_id]
            elif any(j.id == job_id for j in waiting):
                waiting = [j for j in waiting if j.id != job_id]
            else:
                continue
            track.cancelled.add(job_id)
            tell(now, job_id, JobState.CANCELLED)
            dirty = True
        for failure in executor.failed(now):
            if failure.job_id in running:
                end_running(now, failure.job_id)
                track.failed[failure.job_id] = failure.reason
                tell(now, failure.job_id, JobState.FAILED, failure.reason)
                dirty = True
        for job_id in executor.completed(now):
            if job_id in running:
                end_running(now, job_id)
                track.finish[job_id] = now
                tell(now, job_id, JobState.FINISHED)
                dirty = True
        if update.stop:
            break
        if waiting_starts(executor, now):
            dirty = True  # a start waits for workers: decide (and so apply) again until it has them
        if dynamic:
            alive = capacity()  # type: ignore[operator]
            if alive != cap:
                cap, peak, dirty = alive, max(peak, alive), True
            if allocation.total_gpus > cap:
                allocation = executor.in_effect(allocation)  # a lost worker shrank its job

        on_tick = now >= next_tick - EPS
        if on_tick and not dirty and _noise_moved(policy, running, executor, now, decided_noise):
            dirty = True  # a goodput policy's batch follows a job's noise scale: decide again at the tick
        if on_tick and not dirty and settings.trust is not None and running and allocation.total_gpus <= cap:
            # A job measured its exploration worse than a configuration it ran before: revert it now.
            now_running = ClusterSnapshot(time=now, capacity=cap, running=_running_now(running, allocation, executor, now))
            dirty = would_revert(now_running, allocation, settings.trust, _value(policy))
        if dirty and (on_tick or settings.react_to_events) and allocation.total_gpus <= cap:
            snapshot = ClusterSnapshot(
                time=now,
                capacity=cap,
                running=_running_now(running, allocation, executor, now),
                queued=tuple(waiting),
            )
            try:
                decision = reallocate(snapshot, policy, settings.overflow, settings.strict_fifo)
            except InfeasibleError:
                decision = None  # keep what runs; try again at the next tick
            if decision is not None:
                if isinstance(policy, NoiseModel):
                    decided_noise = {r.spec.id: policy.noise_scale(r.spec, r.samples_done, r.noise_scale) for r in snapshot.running}
                    decided_noise |= {j.id: policy.noise_scale(j, 0.0) for j in decision.admission.admitted}
                new = decision.allocation
                if settings.trust is not None:
                    new = trust_measurements(snapshot, new, settings.trust, _value(policy))
                for job in decision.admission.admitted:
                    running[job.id] = job
                    track.start[job.id] = now
                    tell(now, job.id, JobState.RUNNING)
                events = executor.apply(now, allocation, new, specs)
                _record_changes(track, now, allocation, new)
                track.events.extend(events)
                for job in decision.admission.dropped:
                    track.dropped.add(job.id)
                    tell(now, job.id, JobState.DROPPED, "does not fit")
                waiting = list(decision.admission.queued)
                allocation = new
                decisions += 1
                dirty = False
                if observer is not None:
                    observer(
                        StepReport(
                            time=now,
                            allocation=new,
                            events=tuple(events),
                            admitted=tuple(j.id for j in decision.admission.admitted),
                            dropped=tuple(j.id for j in decision.admission.dropped),
                            queued=len(waiting),
                            finished_total=len(track.finish),
                            jobs_total=len(specs),
                        )
                    )
        if on_tick:
            while next_tick <= now + EPS:
                next_tick += settings.interval_s

        arrival = source.next_arrival(now)
        if arrival is None and not waiting and not running:
            break
        if settings.horizon_s is not None and now >= start_time + settings.horizon_s - EPS:
            break

        wakes = [next_tick]
        if arrival is not None and (settings.react_to_events or not (running or waiting)):
            wakes.append(arrival)
        if not running and not waiting and arrival is not None:
            # Idle cluster: skip the empty ticks up to the next arrival.
            gap = arrival - next_tick
            if gap > 0:
                next_tick += (gap // settings.interval_s) * settings.interval_s
                wakes[0] = next_tick
        completion = executor.next_completion(now)
        if completion is not None:
            wakes.append(max(completion, now))
        if settings.horizon_s is not None:
            wakes.append(start_time + settings.horizon_s)
        clock.sleep_until(max(min(wakes), now))

    end = clock.now()
    if allocation.shares:
        _record_changes(track, end, allocation, Allocation())
    records = tuple(
        JobRecord(
            job_id=jid,
            arrival=spec.arrival_time,
            start=track.start.get(jid),
            finish=track.finish.get(jid),
            dropped=jid in track.dropped,
            samples_done=float(spec.total_samples) if jid in track.finish else executor.progress(jid, end) if jid in track.start else 0.0,
            failed=track.failed.get(jid),
            cancelled=jid in track.cancelled,
        )
        for jid, spec in sorted(specs.items(), key=lambda kv: (kv[1].arrival_time, kv[0]))
    )
    return LoopResult(
        policy=policy.name,
        capacity=peak,
        settings=settings,
        end_time=end,
        schedule=tuple(track.schedule),
        events=tuple(track.events),
        jobs=records,
        gpu_usage=tuple(track.usage),
        decisions=decisions,
    )
