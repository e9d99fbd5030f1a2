"""The ``hpo`` flow: run a RubberBand plan for real (seed 001), as a client of the scheduler service.

plan (greedy, in the model, capped at the workers we have) -> for each stage: every surviving
trial is submitted as a job on ``gpus_per_trial`` GPUs (the plan's layout; the service queues
what does not fit and shares the cluster with everyone else's jobs), resumed from its previous
stage's checkpoint -> wait -> rank by the evaluation loss the store recorded, keep the best,
stop the rest -> MLflow: one parent run, one nested run per trial (hyperparameters, loss
curve, GPUs per stage, the stage it stopped after; each stage's job run nested under it) and
the predicted vs measured JCT and cost on the parent.

With a service configured and running (``MALLEABLE_JOB_STORE``) the trials go to it; without,
an embedded service schedules them on a cluster for this run: one code path. The keep rule is
``allocator.hpo.selection``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from allocator.hpo.model import MeasuredStage, Prediction, StageLayout, measured_cost
from allocator.hpo.planner import greedy_plan
from allocator.hpo.selection import keep_best, survivors, trial_score
from allocator.hpo.spec import HpoSpec
from allocator.types import JobSpec
from deploy.clusters import connect
from elastic_tasks.cluster import warm_up
from elastic_tasks.hpo_trial import TrialRecipeSpec, trial_entrypoint
from flows.recording.artifacts import artifact_key
from flows.config.hpo_file import load_hpo_file
from flows.commands.shared.interrupts import on_interrupt
from flows.recording.run_guard import RunGuard
from flows.service_tasks import EmbeddedSession, JobSession, LiveSession, live_service
from flows.config.settings import Settings, load_settings
from flows.recording.tracking import MetricPoint, Tracker, tracker_from_settings
from service.embedded import EmbeddedService
from service.redaction import redact_url
from service.store.records import JobRow, JobState
from service.runner import ServiceConfig

CANCEL_WAIT_S = 30.0  # a timed-out stage's jobs get this long to stop before the flow fails


@dataclass(frozen=True, slots=True)
class TrialRun:
    """One trial's job in one stage, as the store recorded it (times in seconds from the run's t0)."""

    trial: int
    stage: int
    job_id: str
    gpus: int
    start_s: float
    end_s: float
    steps: int
    first_loss: float | None
    final_loss: float | None
    eval_loss: float | None
    checkpoint_dir: str | None
    mlflow_run_id: str | None

    @property
    def score(self) -> float:
        return trial_score(self.eval_loss, self.final_loss)


@dataclass(frozen=True, slots=True)
class StageRecord:
    stage: int
    layout: StageLayout
    trials: tuple[int, ...]
    kept: tuple[int, ...]
    start_s: float
    end_s: float
    predicted_start_s: float
    predicted_end_s: float


@dataclass(frozen=True, slots=True)
class HpoRunResult:
    run: str
    prediction: Prediction
    actual_jct_s: float
    actual_cost: float
    stages: tuple[StageRecord, ...]
    runs: tuple[TrialRun, ...]
    configs: tuple[tuple[tuple[str, object], ...], ...]
    best_trial: int

    def stopped_after(self, trial: int) -> int:
        """The last stage a trial ran in."""
        return max(r.stage for r in self.runs if r.trial == trial)


def capped(spec: HpoSpec, workers: int) -> HpoSpec:
    """The spec with its cloud limited to the workers this run has (whole instances)."""
    per = spec.cloud.instance.gpus
    if workers < per:
        raise ValueError(f"workers={workers}: fewer than one instance of {per} GPUs ({spec.cloud.instance.name})")
    return dataclasses.replace(spec, cloud=dataclasses.replace(spec.cloud, max_instances=min(spec.cloud.max_instances, workers // per)))


@task(name="plan-hpo", cache_policy=NO_CACHE)
def plan_hpo(spec: HpoSpec) -> Prediction:
    return greedy_plan(spec).prediction


def trial_job(spec: HpoSpec, stage: int, trial: int, gpus: int, lr: object, resume_from: str | None) -> JobSpec:
    """One trial's stage as a job: the plan's GPUs (not elastic: the plan is the policy), the
    trial's fixed batch, the stage's iterations as samples."""
    assert spec.entrypoint is not None
    batch = spec.trial.batch
    entry = trial_entrypoint(TrialRecipeSpec(spec.entrypoint, batch, None if lr is None else float(lr), resume_from))
    return JobSpec(
        id=f"{spec.name}-t{trial}-s{stage}", workload=entry, total_samples=spec.stages[stage].iters * batch,
        min_batch=batch, max_batch=batch, fixed_batch=batch, max_gpus=gpus, min_gpus=gpus, requested_gpus=gpus,
        elastic=False, profile=spec.trial.profile,
        # A new sample order per trial and stage (a resumed stage must not replay the first one's).
        seed=spec.seed + 1000 * stage + trial,
    )  # fmt: skip


@task(name="run-hpo-stage", cache_policy=NO_CACHE)
def run_stage(
    session: JobSession,
    spec: HpoSpec,
    stage: int,
    layout: StageLayout,
    trials: tuple[int, ...],
    configs: tuple[dict[str, object], ...],
    resume: dict[int, str | None],
    parents: dict[int, str],
    t0: float,
    timeout_s: float,
) -> list[TrialRun]:
    """Submit every trial of a stage and wait for them; TimeoutError (after cancelling what is
    left) if the stage is not done within ``timeout_s``; RuntimeError naming a trial that failed."""
    ids = {
        k: session.submit(trial_job(spec, stage, k, layout.gpus_per_trial, configs[k].get("lr"), resume[k]), mlflow_parent_run_id=parents.get(k))
        for k in trials
    }
    try:
        rows = {r.id: r for r in session.wait(list(ids.values()), timeout_s)}
    except BaseException:
        _cancel_and_settle(session, list(ids.values()))
        raise
    failed = [(k, rows[j]) for k, j in ids.items() if rows[j].state is not JobState.FINISHED]
    if failed:
        raise RuntimeError("; ".join(f"trial {k} stage {stage} (job {r.id}) {r.state.value}: {r.error or 'no error recorded'}" for k, r in failed))
    return [_trial_run(k, stage, layout.gpus_per_trial, rows[j], t0) for k, j in ids.items()]


def _cancel_and_settle(session: JobSession, job_ids: Sequence[str]) -> None:
    # A failed or interrupted stage leaves nothing running on the team's cluster.
    try:
        session.cancel(job_ids)
        session.wait(job_ids, CANCEL_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - the stage's own error is what the user needs to see
        print(f"could not confirm that the stage's jobs stopped: {type(exc).__name__}: {exc}")


def _trial_run(trial: int, stage: int, gpus: int, row: JobRow, t0: float) -> TrialRun:
    start = (row.started_at or row.submitted_at) - t0
    return TrialRun(
        trial, stage, row.id, gpus, start, (row.finished_at or row.updated_at) - t0, row.steps or 0,
        row.first_loss, row.final_loss, row.eval_loss, row.checkpoint_dir, row.mlflow_run_id,
    )  # fmt: skip


def _trial_points(runs: list[TrialRun], spec: HpoSpec, tracker: Tracker) -> list[MetricPoint]:
    """Loss per cumulative step (from each stage job's own MLflow run when it has one, else its
    first and last loss), GPUs from each stage's first step, eval loss at each stage end."""
    points = []
    for r in sorted(runs, key=lambda r: r.stage):
        offset = sum(s.iters for s in spec.stages[: r.stage])
        points.append(MetricPoint("gpus", r.gpus, offset))
        curve = tracker.metric_history(r.mlflow_run_id, "loss") if r.mlflow_run_id else []
        ends = [(0, r.first_loss), (r.steps, r.final_loss)]
        points.extend(MetricPoint("train_loss", value, offset + step) for step, value in [*curve, *ends] if value is not None)
        if r.eval_loss is not None:
            points.append(MetricPoint("eval_loss", r.eval_loss, offset + r.steps))
        points.append(MetricPoint("stage_wall_s", r.end_s - r.start_s, r.stage))
    return points


@flow(name="hpo", log_prints=True)
def hpo_flow(hpo_file: str, workers: int | None = None, timeout_s: float = 1800.0, to_running_service: bool = True) -> HpoRunResult:
    """Plan ``hpo_file`` for the workers available, run it elastically, and record it in MLflow."""
    settings = load_settings(workers=workers)
    spec = capped(load_hpo_file(hpo_file), settings.workers)
    if spec.entrypoint is None:
        raise ValueError(f"{hpo_file}: entrypoint: missing; running a plan needs 'package.module:function'")
    prediction = plan_hpo(spec)
    configs = spec.sample_configs()
    tracker = tracker_from_settings(settings)
    store_url = live_service(settings) if to_running_service else None
    # The guard ends every run opened below FAILED (an error) or KILLED (Ctrl-C) if the flow
    # does not get to end it: a failed or interrupted HPO run leaves nothing RUNNING.
    with RunGuard(tracker) as guard:
        if store_url is not None:
            print(f"submitting the trials to the service at {redact_url(store_url)}")
            return _run_and_record(spec, settings, prediction, configs, tracker, guard, LiveSession(store_url, f"hpo:{spec.name}"), timeout_s)
        run_id = f"hpo-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        run_dir = settings.state_dir.resolve() / "runs" / run_id
        from service.tracking.experiment import artifact_root

        config = ServiceConfig(
            store_url=f"sqlite:///{run_dir / 'jobs.db'}", checkpoint_root=settings.checkpoint_location(run_id), policy=settings.policy,
            interval_s=settings.interval_s, react=True, poll_s=settings.service_poll_s, checkpoint_every=settings.checkpoint_every,
            tracking_uri=settings.resolved_tracking_uri, experiment=settings.experiment,
            artifact_location=artifact_root(settings.resolved_tracking_uri, settings.state_dir),
        )  # fmt: skip
        with connect(settings.cluster.value, workers=settings.workers, address=settings.scheduler_address) as client:
            client.wait_for_workers(min(settings.workers, max(prediction.plan)), timeout=120)
            warm_up(client, spec.entrypoint)
            with EmbeddedService(config, client) as service, on_interrupt(service.abort):
                return _run_and_record(spec, settings, prediction, configs, tracker, guard, EmbeddedSession(service, run_id), timeout_s)


def _run_and_record(
    spec: HpoSpec,
    settings: Settings,
    prediction: Prediction,
    configs: tuple[dict[str, object], ...],
    tracker: Tracker,
    guard: RunGuard,
    session: JobSession,
    timeout_s: float,
) -> HpoRunResult:
    parent = guard.start_run(
        f"hpo-{spec.name}",
        params={
            "name": spec.name,
            "entrypoint": spec.entrypoint,
            "deadline_s": spec.deadline_s,
            "plan_gpus": list(prediction.plan),
            "stages": [(s.trials, s.iters) for s in spec.stages],
            "instance": f"{spec.cloud.instance.name} x{spec.cloud.instance.gpus} GPUs",
            "billing": spec.cloud.billing.value,
            "workers": settings.workers,
            "batch": spec.trial.batch,
        },
        tags={"malleable.mode": "hpo"},
    )
    children = {
        k: guard.start_run(f"trial-{k}", parent=parent, params={**configs[k], "trial": k}, tags={"malleable.hpo": spec.name})
        for k in range(spec.stages[0].trials)
    }
    # Each stage's job run nests under its trial's run (when MLflow has given that run an id).
    nest_under = {k: run_id for k, child in children.items() if (run_id := tracker.run_id(child)) is not None}
    alive = tuple(range(spec.stages[0].trials))
    resume: dict[int, str | None] = dict.fromkeys(alive)
    runs: list[TrialRun] = []
    records: list[StageRecord] = []
    t0 = time.time()  # the store's timestamps are wall-clock seconds
    for i, predicted in enumerate(prediction.stages):
        layout = predicted.layout
        start = time.time() - t0
        stage_runs = run_stage(session, spec, i, layout, alive, configs, resume, nest_under, t0, timeout_s)
        end = time.time() - t0
        runs.extend(stage_runs)
        kept = keep_best(((r.trial, r.score) for r in stage_runs), survivors(spec.stages, i))
        records.append(StageRecord(i, layout, alive, kept, start, end, predicted.start_s, predicted.end_s))
        for r in stage_runs:
            resume[r.trial] = r.checkpoint_dir
        print(f"stage {i}: {len(alive)} trials on {layout.gpus} GPUs ({layout.gpus_per_trial} each) in {end - start:.1f} s; kept {list(kept)}")
        alive = kept
    actual_jct = records[-1].end_s
    measured = [
        MeasuredStage(rec.start_s, rec.layout.instances, rec.layout.gpus_per_trial, tuple(r.end_s - r.start_s for r in runs if r.stage == rec.stage))
        for rec in records
    ]
    actual_cost = measured_cost(spec.cloud, measured, actual_jct)
    best = records[-1].kept[0]
    for k, child in children.items():
        mine = [r for r in runs if r.trial == k]
        last = max(r.stage for r in mine)
        tracker.log_metrics(child, _trial_points(mine, spec, tracker))
        tracker.set_tags(child, {"stopped_after_stage": last, "survived": last == len(spec.stages) - 1, "best": k == best})
        guard.end_run(child, "FINISHED")
    tracker.log_metrics(
        parent,
        [
            MetricPoint("predicted_jct_s", prediction.jct_s),
            MetricPoint("predicted_cost", prediction.cost),
            MetricPoint("actual_jct_s", actual_jct),
            MetricPoint("actual_cost", actual_cost),
            MetricPoint("jct_error", actual_jct / prediction.jct_s - 1.0),
            MetricPoint("cost_error", actual_cost / prediction.cost - 1.0 if prediction.cost > 0 else 0.0),
            *[MetricPoint("stage_gpus", rec.layout.gpus, rec.stage) for rec in records],
            *[MetricPoint("stage_wall_s", rec.end_s - rec.start_s, rec.stage) for rec in records],
            *[MetricPoint("stage_predicted_s", rec.predicted_end_s - rec.predicted_start_s, rec.stage) for rec in records],
        ],
    )
    tracker.set_tags(parent, {"best_trial": best})
    guard.end_run(parent, "FINISHED")
    create_table_artifact(
        key=artifact_key("hpo", spec.name),
        table=[
            {
                "stage": rec.stage,
                "trials": len(rec.trials),
                "gpus": rec.layout.gpus,
                "gpus_per_trial": rec.layout.gpus_per_trial,
                "kept": " ".join(map(str, rec.kept)),
                "predicted_s": f"{rec.predicted_end_s - rec.predicted_start_s:.1f}",
                "actual_s": f"{rec.end_s - rec.start_s:.1f}",
            }
            for rec in records
        ],
        description=f"HPO {spec.name}: predicted JCT {prediction.jct_s:.1f} s / cost {prediction.cost:.4f}; actual {actual_jct:.1f} s / {actual_cost:.4f}",
    )
    return HpoRunResult(
        parent, prediction, actual_jct, actual_cost, tuple(records), tuple(runs), tuple(tuple(sorted(c.items())) for c in configs), best
    )
