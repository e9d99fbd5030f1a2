"""What the one loop takes and gives: its settings, and the frozen records of a run.

Kept apart from the loop's machinery (``allocator.loop.run``) so that every layer can name a
run's records without the loop; ``allocator.loop`` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.admission import OverflowMode
from allocator.loop.lifecycle import JobState
from allocator.profiles.measured import TrustSettings
from allocator.types import Allocation, RescaleEvent


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """How the loop decides.

    ``interval_s`` is seed 000's Δ. With ``react_to_events`` the loop also re-allocates as
    soon as a job arrives or finishes (the seed's simulator does); without it, changes wait
    for the next tick (the seed's real autoscaler does, and so does Pollux's simulator).
    With ``react_to_noise`` a tick at which the noise scale a noise-aware policy sees for a
    running job has moved since its last decision is a reason to decide (its batches follow
    the noise scale); without it only arrivals, completions and capacity are. ``horizon_s``
    stops the run early.
    """

    interval_s: float = 600.0
    overflow: OverflowMode = OverflowMode.QUEUE
    strict_fifo: bool = True
    react_to_events: bool = True
    horizon_s: float | None = None
    trust: TrustSettings | None = TrustSettings()  # None: the policy's answer as is, measurements or not
    react_to_noise: bool = True

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
