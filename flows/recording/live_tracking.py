"""MLflow while a real run trains: the parent run opens when the loop starts, each job's nested
run when the job first trains, and ``live_loss`` / ``live_samples_seen`` go in at the step count
and wall time rank 0 reported them.

Rank 0 publishes a ``JobStatus`` (steps done, samples, last loss, wall time) on the job's board
after each step; the loop's observer samples it on every decision (each Δ, arrival, completion),
so MLflow's charts move during the run. ``record_run`` then fills in the rest — the exact
per-step ``loss`` history, the schedule, the figures, ``final_*`` — into these same runs. The
live series has its own keys: it is a sample (one point per decision), and its step counts
steps done, where the history's step names the step that produced the loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from allocator.types import JobSpec
from flows.recording.record import job_params
from flows.recording.tracking import MetricPoint, Tracker


@dataclass(slots=True)
class LiveRuns:
    """Runs opened during the loop (ids or offline references) and the steps already logged."""

    parent_run: str
    job_runs: dict[str, str] = field(default_factory=dict)
    logged_steps: dict[str, set[int]] = field(default_factory=dict)  # live samples already sent


class LiveRecorder:
    def __init__(self, tracker: Tracker, name: str, specs: Mapping[str, JobSpec], params: Mapping[str, object], tags: Mapping[str, str]) -> None:
        self._tracker = tracker
        self._specs = specs
        self._mode = tags.get("malleable.mode", "real")
        self.runs = LiveRuns(tracker.start_run(name, params=params, tags=tags))

    def end_all(self, status: str) -> None:
        """End every run opened so far (jobs first, then the parent): a run cut short."""
        for run in [*self.runs.job_runs.values(), self.runs.parent_run]:
            try:
                self._tracker.end_run(run, status)
            except Exception:  # noqa: BLE001 - ending what we can; the original error matters more
                continue

    def sample(self, coordinators: Iterable[tuple[str, object]]) -> None:
        """Log each running job's latest reported step (``(job id, JobCoordinator)`` pairs)."""
        for job_id, coordinator in coordinators:
            status = coordinator.board.status()  # type: ignore[attr-defined]
            if status is None:
                continue
            done = self.runs.logged_steps.setdefault(job_id, set())
            if status.step in done:
                continue
            run = self.runs.job_runs.get(job_id)
            if run is None:
                spec = self._specs[job_id]
                run = self.runs.job_runs[job_id] = self._tracker.start_run(
                    job_id, parent=self.runs.parent_run, params=job_params(spec), tags={"malleable.mode": self._mode}
                )
            ts = int(status.time * 1000)
            self._tracker.log_metrics(run, [MetricPoint("live_loss", status.loss, status.step, ts), MetricPoint("live_samples_seen", status.samples_seen, status.step, ts)])
            done.add(status.step)
