"""The ``hpo`` flow: run a RubberBand plan for real (seed 001).

plan (greedy, in the model, capped at the workers we have) -> for each stage: every
surviving trial runs as an elastic job on ``gpus_per_trial`` Dask workers (trials queue when
the stage has fewer workers than trials), resumed from its previous stage's checkpoint ->
rank by evaluation loss, keep the best, stop the rest -> MLflow: one parent run, one nested
run per trial (hyperparameters, loss curve, GPUs over steps, the stage it stopped after) and
the predicted vs measured JCT and cost on the parent.

The flow only wires: the trial queue is ``elastic_tasks.trial_queue``, the keep rule
``allocator.hpo.selection``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from distributed import Client
from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from allocator.hpo.model import MeasuredStage, Prediction, StageLayout, measured_cost
from allocator.hpo.planner import greedy_plan
from allocator.hpo.selection import keep_best, survivors
from allocator.hpo.spec import HpoSpec
from deploy.clusters import connect
from elastic_tasks.cluster import warm_up
from elastic_tasks.hpo_trial import TrialRecipeSpec, trial_entrypoint
from elastic_tasks.protocol import TrainConfig
from elastic_tasks.trial_queue import TrialLaunch, TrialRun, run_trials
from flows.flow_artifacts import artifact_key
from flows.hpo_file import load_hpo_file
from flows.run_guard import RunGuard
from flows.settings import Settings, load_settings
from flows.tracking import MetricPoint, Tracker, tracker_from_settings

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


@task(name="run-hpo-stage", cache_policy=NO_CACHE)
def run_stage(
    client: Client,
    spec: HpoSpec,
    stage: int,
    layout: StageLayout,
    trials: tuple[int, ...],
    configs: tuple[dict[str, object], ...],
    resume: dict[int, str | None],
    root: Path,
    t0: float,
    timeout_s: float,
) -> list[TrialRun]:
    """Train every trial of a stage: ``layout.parallel`` at a time on ``gpus_per_trial`` workers each."""
    assert spec.entrypoint is not None
    launches = []
    for k in trials:
        lr = configs[k].get("lr")
        entry = trial_entrypoint(TrialRecipeSpec(spec.entrypoint, spec.trial.batch, None if lr is None else float(lr), resume[k]))
        config = TrainConfig(
            global_batch=spec.trial.batch,
            max_steps=spec.stages[stage].iters,
            seed=spec.seed + 1000 * stage + k,
            max_batch_per_gpu=spec.trial.profile.max_batch_per_gpu,
            lr_ramp_steps=0,
            checkpoint_dir=str(root / f"trial-{k}" / f"stage-{stage}"),
        )
        launches.append(TrialLaunch(k, f"{spec.name}-t{k}-s{stage}-{uuid.uuid4().hex[:6]}", entry, config))
    return run_trials(client, stage, launches, layout.parallel, layout.gpus_per_trial, t0, timeout_s)


def _trial_points(runs: list[TrialRun], spec: HpoSpec) -> list[MetricPoint]:
    """Loss per cumulative step, GPUs from each stage's first step, eval loss at each stage end."""
    points = []
    for r in sorted(runs, key=lambda r: r.stage):
        offset = sum(s.iters for s in spec.stages[: r.stage])
        points.append(MetricPoint("gpus", r.gpus, offset))
        points.extend(MetricPoint("train_loss", rec.loss, offset + rec.step) for rec in r.history)
        if r.eval_loss is not None:
            points.append(MetricPoint("eval_loss", r.eval_loss, offset + r.steps))
        points.append(MetricPoint("stage_wall_s", r.end_s - r.start_s, r.stage))
    return points


@flow(name="hpo", log_prints=True)
def hpo_flow(hpo_file: str, workers: int | None = None, timeout_s: float = 1800.0) -> HpoRunResult:
    """Plan ``hpo_file`` for the workers available, run it elastically, and record it in MLflow."""
    settings = load_settings(workers=workers)
    spec = capped(load_hpo_file(hpo_file), settings.workers)
    if spec.entrypoint is None:
        raise ValueError(f"{hpo_file}: entrypoint: missing; running a plan needs 'package.module:function'")
    prediction = plan_hpo(spec)
    configs = spec.sample_configs()
    tracker = tracker_from_settings(settings)
    # The guard ends every run opened below FAILED (an error) or KILLED (Ctrl-C) if the flow
    # does not get to end it: a failed or interrupted HPO run leaves nothing RUNNING.
    with RunGuard(tracker) as guard:
        return _run_and_record(spec, settings, prediction, configs, tracker, guard, timeout_s)


def _run_and_record(
    spec: HpoSpec, settings: Settings, prediction: Prediction, configs: tuple[dict[str, object], ...], tracker: Tracker, guard: RunGuard, timeout_s: float
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
    root = settings.resolved_checkpoint_dir / f"hpo-{spec.name}-{uuid.uuid4().hex[:8]}"
    alive = tuple(range(spec.stages[0].trials))
    resume: dict[int, str | None] = dict.fromkeys(alive)
    runs: list[TrialRun] = []
    records: list[StageRecord] = []
    with connect(settings.cluster.value, workers=settings.workers, address=settings.scheduler_address) as client:
        client.wait_for_workers(min(settings.workers, max(prediction.plan)), timeout=120)
        warm_up(client, spec.entrypoint)
        t0 = time.monotonic()
        for i, predicted in enumerate(prediction.stages):
            layout = predicted.layout
            start = time.monotonic() - t0
            stage_runs = run_stage(client, spec, i, layout, alive, configs, resume, root, t0, timeout_s)
            end = time.monotonic() - t0
            runs.extend(stage_runs)
            kept = keep_best(((r.trial, r.score) for r in stage_runs), survivors(spec.stages, i))
            records.append(StageRecord(i, layout, alive, kept, start, end, predicted.start_s, predicted.end_s))
            for r in stage_runs:
                resume[r.trial] = r.checkpoint_dir
            print(f"stage {i}: {len(alive)} trials on {layout.gpus} workers ({layout.gpus_per_trial} each) in {end - start:.1f} s; kept {list(kept)}")
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
        tracker.log_metrics(child, _trial_points(mine, spec))
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
