"""Writes what the loop does into the store (and MLflow) as it happens: phase changes,
allocations, progress. The store is how submitters watch, and how a restart resumes."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from allocator.loop import JobTransition, StepReport
from allocator.types import Share
from allocator.wall_split import WallSplit
from service.store import schema
from service.display import ERROR_CHARS, shown
from service.job_metrics import service_job_metrics
from service.store.records import RESUMABLE, AllocationRow, JobState
from service.store import JobStore
from service.tracking import ServiceTracking

if TYPE_CHECKING:
    from elastic_tasks.coordinator.outcomes import JobResult


class JobFigures(Protocol):
    """What the executor measures of a job (``DaskExecutor``): samples/s per generation, predicted
    and measured, and where its wall time went."""

    def predicted_rate(self, job_id: str, share: Share) -> float | None: ...

    def measured_rate(self, job_id: str, share: Share) -> float | None: ...

    def wall_split(self, job_id: str, submitted: float | None, end: float) -> WallSplit | None: ...

_MLFLOW_END = {JobState.FINISHED: "FINISHED", JobState.FAILED: "FAILED", JobState.CANCELLED: "KILLED", JobState.DROPPED: "KILLED"}


class StoreRecorder:
    """``on_job`` and ``observer`` for ``run_loop``; ``board_of``/``result_of`` read the executor's jobs."""

    def __init__(
        self,
        store: JobStore,
        tracking: ServiceTracking,
        checkpoint_dir_of: Callable[[str], str],
        board_of: Callable[[str], str | None],
        say: Callable[[str], None],
        result_of: Callable[[str], JobResult | None] = lambda _job: None,
        rates: JobFigures | None = None,
        team_of: Mapping[str, str] | None = None,
    ) -> None:
        self.store, self.tracking, self.checkpoint_dir_of, self.board_of, self.say = store, tracking, checkpoint_dir_of, board_of, say
        self.result_of = result_of
        self.rates = rates
        self.team_of: Mapping[str, str] = {} if team_of is None else team_of  # filled by the feed as jobs arrive
        self._shares: dict[str, Share] = {}  # each running job's current share: the generation its measured rate belongs to

    def _generation_ends(self, job_id: str) -> None:
        """Record what the job's ending generation measured (samples/s), in its allocation row and MLflow run."""
        share = self._shares.pop(job_id, None)
        measured = self.rates.measured_rate(job_id, share) if self.rates is not None and share is not None else None
        if measured is not None:
            self.store.record_measured_rate(job_id, measured)
            self.tracking.metrics(job_id, {"measured_samples_per_s": measured, "measured_gpus": share.gpus, "measured_batch": share.global_batch})

    def on_job(self, t: JobTransition) -> None:
        state = t.phase
        if t.phase is JobState.QUEUED:
            self.store.set_state(t.job_id, state, only_from=RESUMABLE)
            return
        if t.phase is JobState.RUNNING:
            row = self.store.job(t.job_id)
            version = _code_version(row)
            run_id = self.tracking.job_run(
                t.job_id, row.name, row.mlflow_run_id, {**row.spec, "submitter": row.submitter, **self._team(t.job_id)}, parent=row.mlflow_parent_run_id, submitter=row.submitter,
                tags={"malleable.code_version": version} if version else None,
            )
            # A new run's id is written by the tracking thread once MLflow made it (``on_run``):
            # only a known id is written here, never a None over one that arrived first.
            known = {"mlflow_run_id": run_id} if run_id else {}
            self.store.set_state(
                t.job_id, state, only_from=RESUMABLE, attempts=schema.jobs.c.attempts + 1,
                checkpoint_dir=self.checkpoint_dir_of(t.job_id), error=None, code_version=version, **known,
            )  # fmt: skip
            self.say(f"{t.job_id} ({shown(row.name)}) running" + (f", resumed (attempt {row.attempts + 1})" if row.attempts else ""))
            return
        self._generation_ends(t.job_id)
        fields: dict[str, object] = {}
        if t.detail:
            fields["error"] = t.detail
        result = self.result_of(t.job_id)
        if t.phase is JobState.FINISHED:
            fields["samples_done"] = schema.jobs.c.total_samples
            if result is not None:
                # What a client ranks or compares jobs by (an HPO stage keeps its best trials).
                fields.update(steps=result.steps, first_loss=result.history[0].loss if result.history else None, final_loss=result.final_loss, eval_loss=result.eval_loss)
        split = self._wall_split(t.job_id)
        if split is not None:
            fields["wall_split"] = json.dumps(split.as_dict())
        self.store.set_state(t.job_id, state, **fields)
        if split is not None:
            self.tracking.metrics(t.job_id, {f"wall_{k}": v for k, v in split.as_dict().items()} | {"wall_unaccounted_pct": split.unaccounted_pct})
        if self.tracking.enabled:
            # The same end values a job of `malleable run` gets (final_*, jct_s, rescales, ...).
            row = self.store.job(t.job_id)
            self.tracking.job_final(t.job_id, service_job_metrics(row, self.store.allocations(t.job_id), result), int(time.time() * 1000))
        schedule = _schedule_csv(self.store.allocations(t.job_id)) if self.tracking.enabled else ""
        self.tracking.job_ended(t.job_id, _MLFLOW_END[t.phase], error=t.detail if t.phase is JobState.FAILED else None, texts={"schedule.csv": schedule} if schedule else None)
        self.say(f"{t.job_id} {state.value}" + (f": {shown(t.detail, ERROR_CHARS)}" if t.detail else ""))

    def _wall_split(self, job_id: str) -> WallSplit | None:
        """The ending job's wall time split (queued time included: from its submission to now)."""
        if self.rates is None:
            return None
        return self.rates.wall_split(job_id, self.store.job(job_id).submitted_at, time.time())

    def observer(self, report: StepReport) -> None:
        now = time.time()
        rows = []
        for e in report.events:
            after = e.after
            self._generation_ends(e.job_id)
            predicted = self.rates.predicted_rate(e.job_id, after) if self.rates is not None and after is not None else None
            rows.append(AllocationRow(e.job_id, now, after.gpus if after else 0, after.global_batch if after else 0, e.kind.value, predicted))
            if after is not None:
                self._shares[e.job_id] = after
                self.tracking.metrics(e.job_id, {"gpus": after.gpus, "batch": after.global_batch, "rescale_pause_s": e.cost_s, "predicted_samples_per_s": predicted})
            board = self.board_of(e.job_id)
            if e.before is None and board is not None:
                self.store.update_job(e.job_id, board_id=board)
        self.store.record_allocations(rows)
        # Every team seen so far, 0 when none of its jobs runs: the curve drops to 0 rather than stops.
        teams = {f"team_gpus.{_metric_name(t)}": 0.0 for t in set(self.team_of.values())}
        if self.team_of:
            for job_id, share in report.allocation.shares:
                key = f"team_gpus.{_metric_name(self.team_of.get(job_id, '-'))}"
                teams[key] = teams.get(key, 0.0) + share.gpus
        self.tracking.metrics(None, {"gpus_in_use": report.allocation.total_gpus, "jobs_queued": report.queued, **teams})

    def _team(self, job_id: str) -> dict[str, str]:
        team = self.team_of.get(job_id)
        return {} if team is None else {"team": team}


def _schedule_csv(rows) -> str:
    """The job's generations as a CSV artifact: when (seconds since its first start), GPUs, global
    batch, how it began, and the model's and the measured samples/s."""
    if not rows:
        return ""
    t0 = rows[0].time
    lines = ["t_s,gpus,batch,kind,predicted_samples_per_s,measured_samples_per_s"]
    for r in rows:
        rates = ("" if v is None else f"{v:.6g}" for v in (r.predicted_samples_per_s, r.measured_samples_per_s))
        lines.append(",".join([f"{r.time - t0:.3f}", str(r.gpus), str(r.batch), r.kind, *rates]))
    return "\n".join(lines) + "\n"


def _code_version(row) -> str | None:
    """The job's code as it starts (its ranks load that file fresh: elastic_tasks.code_version)."""
    from elastic_tasks.code_version import code_version
    from elastic_tasks.workloads import resolve_workload

    try:
        return code_version(resolve_workload(row.spec["workload"], row.id))
    except (KeyError, ValueError):
        return None


def _metric_name(text: str) -> str:
    """A team name as an MLflow metric name may spell it (letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^\w.\- /]", "_", text)[:100]
