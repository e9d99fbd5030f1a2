"""``DaskExecutor``: the allocator loop's Executor protocol, on real elastic jobs.

Every job of the loop becomes a ``JobCoordinator``; ``apply`` turns the allocation change
into starts, in-place rescales and stops, shrinking and stopping first so the workers they
free are there for the jobs that grow. Events carry the pause the ranks measured.
Times are seconds since the executor's clock started (the loop's times).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from distributed import Client

from allocator.loop import share_changes
from allocator.types import Allocation, JobSpec, RescaleEvent, RescaleKind, Share
from elastic_tasks.cluster import WorkerPool
from elastic_tasks.coordinator import JobCoordinator, JobResult
from elastic_tasks.protocol import TrainConfig


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

    timeout_s: float = 30.0
    seed: int = 0
    checkpoint_root: str | None = None
    checkpoint_every: int = 0
    lr_ramp_steps: int = 100
    poll_s: float = 0.5

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
    ) -> None:
        self.client = client
        self.pool = WorkerPool(client)
        self._entry = entrypoints
        self.settings = settings
        self.clock = clock or WallClock()
        self.jobs: dict[str, JobCoordinator] = {}
        self.results: dict[str, JobResult] = {}
        self._reported: set[str] = set()

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
            global_batch=share.batch,
            total_samples=spec.total_samples,
            seed=s.seed,
            max_batch_per_gpu=spec.profile.max_batch_per_gpu,
            lr_ramp_steps=s.lr_ramp_steps,
            checkpoint_dir=None if s.checkpoint_root is None else f"{s.checkpoint_root}/{spec.id}",
            checkpoint_every=s.checkpoint_every if s.checkpoint_root is not None else 0,
            timeout_s=s.timeout_s,
        )

    def apply(self, now: float, previous: Allocation, new: Allocation, jobs: Mapping[str, JobSpec]) -> list[RescaleEvent]:
        changes = share_changes(previous, new)
        # Free workers before taking any: stops, then shrinks, then grows and starts.
        changes.sort(key=lambda c: (c[2] is not None, c[1] is None, (c[2].gpus - c[1].gpus) if c[1] and c[2] else 0))
        events = []
        for job_id, before, after in changes:
            job = self.jobs.get(job_id)
            if job is not None and job.finished:
                continue
            if after is None:
                if job is not None:
                    job.stop()
                events.append(RescaleEvent(now, job_id, before, None, RescaleKind.STOP, 0.0, measured=True))
            elif job is None or before is None:
                spec = jobs[job_id]
                job = self.jobs[job_id] = JobCoordinator(self.client, self.pool, job_id, self.entrypoint(spec), self._config(spec, after))
                outcome = job.start(after.gpus, after.batch)
                events.append(RescaleEvent(now, job_id, None, after, RescaleKind.START, outcome.pause_s, measured=True))
            else:
                outcome = job.rescale(after.gpus, after.batch)
                if outcome is None:
                    continue  # the job ended first: nothing was rescaled, its completion frees it
                events.append(RescaleEvent(now, job_id, before, after, RescaleKind.IN_PLACE, outcome.pause_s, measured=True))
        return events

    def progress(self, job_id: str, now: float) -> float:
        if job_id in self.results:
            return float(self.results[job_id].samples_seen)
        job = self.jobs.get(job_id)
        status = job.status() if job is not None else None
        return float(status.samples_seen) if status is not None else 0.0

    def completed(self, now: float) -> list[str]:
        done = []
        for job_id, job in self.jobs.items():
            if job_id not in self._reported and job.finished:
                self.results[job_id] = job.wait(timeout=60)
                self._reported.add(job_id)
                done.append(job_id)
        return done

    def next_completion(self, now: float) -> float | None:
        """Not known exactly: wake up every ``poll_s`` while anything runs to notice completions."""
        running = [j for j, job in self.jobs.items() if j not in self._reported and job.members]
        return now + self.settings.poll_s if running else None

    def close(self) -> None:
        for job_id, job in self.jobs.items():
            if job_id not in self._reported:
                job.stop()
                job.close()
