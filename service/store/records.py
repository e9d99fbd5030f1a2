"""What crosses the store's boundary: job states, submissions, rows as frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocator.loop.lifecycle import JobState  # the one job-state vocabulary (loop, store, CLI)

if TYPE_CHECKING:  # read by the service and the loop; `malleable jobs` lists rows without them
    from allocator.types import JobSpec


# A service takes these up when it starts (a crash leaves jobs "running" in the store).
RESUMABLE = (JobState.QUEUED, JobState.RUNNING, JobState.SUSPENDED)


@dataclass(frozen=True, slots=True)
class Submission:
    """One job to submit, already parsed and checked (``service.jobs.jobspec.check_submission``).
    ``idempotency_key``: a retried submission with the same key returns the first job instead of
    creating a second. ``keep_id``: the store keeps the job under ``spec.id`` rather than a new id
    (a store private to one run, whose jobs file made the ids unique: the run's results then name
    jobs as its file does, with nothing to map back)."""

    name: str
    spec: JobSpec
    submitter: str
    idempotency_key: str | None = None
    mlflow_parent_run_id: str | None = None  # the service nests the job's MLflow run under this one
    keep_id: bool = False


@dataclass(frozen=True, slots=True)
class Submitted:
    job_id: str
    created: bool  # False: the idempotency key named an earlier submission


@dataclass(frozen=True, slots=True)
class JobRow:
    seq: int
    id: str
    name: str
    submitter: str
    state: JobState
    spec: dict  # the job as allocator.specs.spec_to_dict wrote it, under this row's id (older rows upgraded on read)
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float
    error: str | None
    checkpoint_dir: str | None
    mlflow_run_id: str | None
    board_id: str | None
    gpus: int
    batch: int
    samples_done: float
    total_samples: int
    attempts: int
    cancel_requested: bool
    # Measured when the job finished (None before, or when the trainer reported none).
    steps: int | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    eval_loss: float | None = None
    mlflow_parent_run_id: str | None = None
    wall_split: dict | None = None  # where a finished job's wall time went: seconds per named part (WallSplit as JSON)
    code_version: str | None = None  # "sha256:<hex>" of the entry point's module file as the job last started

    def job_spec(self) -> JobSpec:
        """The stored job, whole, as the loop takes it; ValueError naming the field for a row that
        was edited by hand (or by a version whose rules differ)."""
        from allocator.specs import spec_from_dict

        return spec_from_dict(self.spec, f"job {self.id!r}")

    @property
    def progress(self) -> float:
        return min(1.0, self.samples_done / self.total_samples) if self.total_samples else 0.0


@dataclass(frozen=True, slots=True)
class AllocationRow:
    job_id: str
    time: float
    gpus: int
    batch: int
    kind: str
    # The generation's samples/s: the model's when it was decided, and what its steps measured (None: unknown).
    predicted_samples_per_s: float | None = None
    measured_samples_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    holder: str | None
    host: str | None
    pid: int | None
    expires_at: float
    cluster_address: str | None
    cluster_owned: bool
