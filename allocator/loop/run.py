"""One run of the loop: its state, and the steps ``run_loop`` takes each time it wakes.

``run_loop`` (``allocator.loop``) reads as its transitions — ingest arrivals and cancellations,
reap failures and completions, follow the capacity, decide if due, sleep until the next reason
to wake — and ``LoopRun`` holds what those steps share: the waiting and running jobs, the
allocation in effect, the tick, and the records the run returns. One object per run; nothing
outlives it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from allocator.admission import OverflowMode, admit, reallocate
from allocator.loop.execution import Executor, Preempter, reported_change_cost, reported_measurements, reported_noise_scale, reported_profile, waiting_starts
from allocator.physics.goodput import NoiseModel
from allocator.loop.lifecycle import JobState
from allocator.loop.types import JobRecord, JobTransition, LoopResult, LoopSettings, ScheduleRow, StepReport
from allocator.profiles.measured import Value, goodput_value, rate_value, trust_measurements, would_revert
from allocator.policies.base import Policy
from allocator.loop.sources import EPS, Arrivals, JobSource
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, RescaleEvent, RescaleKind, RunningJob


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
            track.schedule.append(ScheduleRow(now, job_id, share.gpus, share.global_batch, share.accum_steps))
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


def _remove(allocation: Allocation, job_id: str) -> Allocation:
    return Allocation(tuple(p for p in allocation.shares if p[0] != job_id))


class LoopRun:
    """The state one ``run_loop`` call moves through (see the module docstring)."""

    def __init__(
        self,
        specs: dict[str, JobSpec],
        policy: Policy,
        capacity: int | Callable[[], int],
        executor: Executor,
        settings: LoopSettings,
        start_time: float,
        observer: Callable[[StepReport], None] | None,
        on_job: Callable[[JobTransition], None] | None,
    ) -> None:
        self.specs = specs
        self.policy = policy
        self.executor = executor
        self.settings = settings
        self.observer = observer
        self.on_job = on_job
        self._capacity = capacity if callable(capacity) else None
        self.cap: int = capacity() if callable(capacity) else capacity
        self.peak = self.cap
        self.waiting: list[JobSpec] = []
        self.running: dict[str, JobSpec] = {}
        self.allocation = Allocation()
        self.track = _Tracking()
        self.start_time = start_time
        self.next_tick = start_time
        self.dirty = False  # something changed since the last decision
        self.decisions = 0
        self.decided_noise: dict[str, float] = {}  # each running job's noise scale, as a noise-aware policy saw it at its last decision

    def _tell(self, now: float, job_id: str, state: JobState, detail: str = "") -> None:
        if self.on_job is not None:
            self.on_job(JobTransition(now, job_id, state, detail))

    def _apply(self, now: float, new: Allocation) -> list[RescaleEvent]:
        events = self.executor.apply(now, self.allocation, new, self.specs)
        _record_changes(self.track, now, self.allocation, new)
        self.track.events.extend(events)
        self.allocation = new
        return events

    def _end_running(self, now: float, job_id: str) -> None:
        """A running job left (finished, failed): its GPUs are free at once, decision or not."""
        del self.running[job_id]
        self.track.schedule.append(ScheduleRow(now, job_id, 0, 0))
        self.allocation = _remove(self.allocation, job_id)
        _record_usage(self.track, now, self.allocation.total_gpus)

    # -- the steps of one wake-up, in order ---------------------------------------------------

    def ingest(self, now: float, update: Arrivals) -> None:
        """Arrivals join the queue (or are dropped: larger than any cluster); cancellations leave."""
        for job in update.jobs:
            self.specs[job.id] = job
            self.track.arrival[job.id] = job.arrival_time
            if self._capacity is not None or _fits_alone(job, self.cap, self.policy, now):
                self.waiting.append(job)
                self._tell(now, job.id, JobState.QUEUED)
            else:
                self.track.dropped.add(job.id)  # larger than the whole cluster: would wait forever
                self._tell(now, job.id, JobState.DROPPED, f"needs more than the cluster's {self.cap} GPUs")
            self.dirty = True
        for job_id in update.cancelled:
            if job_id in self.running:
                self._apply(now, _remove(self.allocation, job_id))
                del self.running[job_id]
            elif any(j.id == job_id for j in self.waiting):
                self.waiting = [j for j in self.waiting if j.id != job_id]
            else:
                continue
            self.track.cancelled.add(job_id)
            self._tell(now, job_id, JobState.CANCELLED)
            self.dirty = True

    def reap(self, now: float) -> None:
        """Jobs the executor gave up on, then jobs that finished."""
        for failure in self.executor.failed(now):
            if failure.job_id in self.running:
                self._end_running(now, failure.job_id)
                self.track.failed[failure.job_id] = failure.reason
                self._tell(now, failure.job_id, JobState.FAILED, failure.reason)
                self.dirty = True
        for job_id in self.executor.completed(now):
            if job_id in self.running:
                self._end_running(now, job_id)
                self.track.finish[job_id] = now
                self._tell(now, job_id, JobState.FINISHED)
                self.dirty = True

    def follow_capacity(self, now: float) -> None:
        """A start waiting for workers, or a changed number of live GPUs, is a reason to decide."""
        if waiting_starts(self.executor, now):
            self.dirty = True  # a start waits for workers: decide (and so apply) again until it has them
        if self._capacity is not None:
            alive = self._capacity()
            if alive != self.cap:
                self.cap, self.peak, self.dirty = alive, max(self.peak, alive), True
            self._follow_lost_ranks(now)
            if self.allocation.total_gpus > self.cap:
                self.allocation = self.executor.in_effect(self.allocation)  # a lost worker shrank its job

    def _follow_lost_ranks(self, now: float) -> None:
        """A job that lost ranks trains on fewer GPUs than it was given (its coordinator shrank it
        in place): that is a change of share like any other, so the observer hears it (the
        service's allocation history records it) and the policy decides again. Its worker may
        still count as alive (a cut link lapses only after the scheduler's heartbeat timeout),
        so this is asked at every wake, not only when the capacity drops. A start or grow that
        waits for workers also runs smaller than planned, but lost nothing: it is left out."""
        waiting = set(waiting_starts(self.executor, now))
        effective = self.executor.in_effect(self.allocation)
        shrunk = [
            (job_id, before, after)
            for job_id, before in self.allocation.shares
            if job_id not in waiting and (after := effective.get(job_id)) is not None and after.gpus < before.gpus
        ]
        if not shrunk:
            return
        # The pause was the coordinator's recovery, measured there: unknown to the loop.
        events = [RescaleEvent(now, job_id, before, after, RescaleKind.IN_PLACE, None, measured=True) for job_id, before, after in shrunk]
        new = Allocation(tuple((job_id, next((a for j, _, a in shrunk if j == job_id), share)) for job_id, share in self.allocation.shares))
        _record_changes(self.track, now, self.allocation, new)
        self.track.events.extend(events)
        self.allocation, self.dirty = new, True
        if self.observer is not None:
            self.observer(
                StepReport(
                    time=now, allocation=new, events=tuple(events), admitted=(), dropped=(), queued=len(self.waiting),
                    finished_total=len(self.track.finish), jobs_total=len(self.specs),
                )
            )  # fmt: skip

    def on_tick(self, now: float) -> bool:
        return now >= self.next_tick - EPS

    def decision_due(self, now: float, on_tick: bool) -> bool:
        """At a tick a moved noise scale or a worse-measured exploration is a reason too."""
        fits = self.allocation.total_gpus <= self.cap
        if on_tick and not self.dirty and self.settings.react_to_noise and _noise_moved(self.policy, self.running, self.executor, now, self.decided_noise):
            self.dirty = True  # a goodput policy's batch follows a job's noise scale: decide again at the tick
        if on_tick and not self.dirty and self.settings.trust is not None and self.running and fits:
            # A job measured its exploration worse than a configuration it ran before: revert it now.
            now_running = ClusterSnapshot(time=now, capacity=self.cap, running=self._running_now(now))
            self.dirty = would_revert(now_running, self.allocation, self.settings.trust, _value(self.policy))
        return self.dirty and (on_tick or self.settings.react_to_events) and fits

    def decide(self, now: float) -> None:
        """Admit, allocate (trusting what jobs measured), apply, and tell the observer."""
        snapshot = ClusterSnapshot(time=now, capacity=self.cap, running=self._running_now(now), queued=tuple(self.waiting))
        try:
            decision = reallocate(snapshot, self.policy, self.settings.overflow, self.settings.strict_fifo)
        except InfeasibleError:
            return  # keep what runs; try again at the next tick
        policy = self.policy
        if isinstance(policy, NoiseModel):
            self.decided_noise = {r.spec.id: policy.noise_scale(r.spec, r.samples_done, r.noise_scale) for r in snapshot.running}
            self.decided_noise |= {j.id: policy.noise_scale(j, 0.0) for j in decision.admission.admitted}
        new = decision.allocation
        if self.settings.trust is not None:
            new = trust_measurements(snapshot, new, self.settings.trust, _value(policy))
        for job in decision.preempted:
            # Back to the queue with its progress (the executor stops it; a restart resumes it).
            if isinstance(self.executor, Preempter):
                self.executor.preempt(job.id)
            del self.running[job.id]
            self._tell(now, job.id, JobState.QUEUED, "preempted: its team's share is needed by another team or a higher class")
        for job in decision.admission.admitted:
            self.running[job.id] = job
            self.track.start.setdefault(job.id, now)  # a preempted job's first start stays its start
            self._tell(now, job.id, JobState.RUNNING)
        events = self._apply(now, new)
        for job in decision.admission.dropped:
            self.track.dropped.add(job.id)
            self._tell(now, job.id, JobState.DROPPED, "does not fit")
        self.waiting = list(decision.admission.queued)
        self.decisions += 1
        self.dirty = False
        if self.observer is not None:
            self.observer(
                StepReport(
                    time=now,
                    allocation=new,
                    events=tuple(events),
                    admitted=tuple(j.id for j in decision.admission.admitted),
                    dropped=tuple(j.id for j in decision.admission.dropped),
                    queued=len(self.waiting),
                    finished_total=len(self.track.finish),
                    jobs_total=len(self.specs),
                )
            )

    def advance_tick(self, now: float) -> None:
        while self.next_tick <= now + EPS:
            self.next_tick += self.settings.interval_s

    def next_wake(self, now: float, source: JobSource) -> float | None:
        """When to wake next: the tick, an arrival, a completion or the horizon; None: the run is over."""
        settings = self.settings
        arrival = source.next_arrival(now)
        if arrival is None and not self.waiting and not self.running:
            return None
        if settings.horizon_s is not None and now >= self.start_time + settings.horizon_s - EPS:
            return None
        wakes = [self.next_tick]
        if arrival is not None and (settings.react_to_events or not (self.running or self.waiting)):
            wakes.append(arrival)
        if not self.running and not self.waiting and arrival is not None:
            # Idle cluster: skip the empty ticks up to the next arrival.
            gap = arrival - self.next_tick
            if gap > 0:
                self.next_tick += (gap // settings.interval_s) * settings.interval_s
                wakes[0] = self.next_tick
        completion = self.executor.next_completion(now)
        if completion is not None:
            wakes.append(max(completion, now))
        if settings.horizon_s is not None:
            wakes.append(self.start_time + settings.horizon_s)
        return max(min(wakes), now)

    def _running_now(self, now: float) -> tuple[RunningJob, ...]:
        executor = self.executor
        return tuple(
            RunningJob(
                _as_measured(spec, executor, now), self.allocation.get(j), executor.progress(j, now), reported_noise_scale(executor, j, now),
                reported_measurements(executor, j, now), reported_change_cost(executor, j),
            )  # fmt: skip
            for j, spec in self.running.items()
        )

    def result(self, end: float) -> LoopResult:
        if self.allocation.shares:
            _record_changes(self.track, end, self.allocation, Allocation())
        track, executor = self.track, self.executor
        records = tuple(
            JobRecord(
                job_id=jid,
                arrival=spec.arrival_time,
                start=track.start.get(jid),
                finish=track.finish.get(jid),
                dropped=jid in track.dropped,
                samples_done=float(spec.work_samples) if jid in track.finish else executor.progress(jid, end) if jid in track.start else 0.0,
                failed=track.failed.get(jid),
                cancelled=jid in track.cancelled,
            )
            for jid, spec in sorted(self.specs.items(), key=lambda kv: (kv[1].arrival_time, kv[0]))
        )
        return LoopResult(
            policy=self.policy.name,
            capacity=self.peak,
            settings=self.settings,
            end_time=end,
            schedule=tuple(track.schedule),
            events=tuple(track.events),
            jobs=records,
            gpu_usage=tuple(track.usage),
            decisions=self.decisions,
        )
