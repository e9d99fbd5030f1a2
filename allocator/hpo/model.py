"""The execution model: predict an HPO plan's job completion time (JCT) and cost (seed 001 §4.2).

A plan gives the GPUs of each stage. The model walks the paper's DAG stage by stage:

* SCALE + INIT_INSTANCE: if the stage needs more instances than are up, new ones are
  requested when the previous stage ends and the stage waits for the slowest to be ready
  (provisioning latency, not billed; then initialisation latency, billed). Surplus instances
  are released when a stage that needs fewer begins.
* TRAIN: the stage's GPUs are shared fairly. With at least as many GPUs as trials, every
  trial runs at once on ``gpus // trials`` GPUs; with fewer, each GPU runs one trial at a time
  and the rest queue (list scheduling: the next trial goes to the first GPU that frees).
  A trial run costs its start-up latency plus ``iters`` steps; a step at the job's fixed
  global batch on g GPUs takes ``(accum - 1) t_proc(micro) + last_micro_step(t_proc(micro), t_comm(p, g))`` from
  ``allocator.physics.throughput`` (gradient accumulation when the memory cap forces it), with the
  instance type's cross-instance allreduce for trials that placement had to split.
* SYNC: the stage ends when its last trial ends, plus the barrier latency.

Cost: per-instance billing charges each instance's lifetime (from running to release),
rounded by ``CloudModel.charge``; per-function billing charges each trial run's GPU-seconds,
each run rounded the same way. Data: every provisioned instance downloads the data set once.

Deterministic mode uses every latency's mean. Monte-Carlo mode (``samples > 0``) draws
latencies and each trial run's per-step time from an explicit ``numpy.random.Generator``
and averages JCT and cost over the samples, as the paper's simulator does.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from allocator.hpo.placement import stage_spans
from allocator.hpo.spec import Billing, CloudModel, HpoSpec, Stage, TrialModel
from allocator.physics.throughput import last_micro_step, t_comm, t_proc
from allocator.types import AllreduceModel

# A straggler draw never makes a step faster than this fraction of the mean.
_MIN_NOISE_FACTOR = 0.05


@dataclass(frozen=True, slots=True)
class StageLayout:
    """How a stage's GPUs are used: GPUs per trial, trials at once, instances up, trials split."""

    gpus: int
    gpus_per_trial: int
    parallel: int
    waves: int
    instances: int
    split_trials: int


@dataclass(frozen=True, slots=True)
class StagePrediction:
    layout: StageLayout
    start_s: float
    end_s: float
    step_s: float


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted JCT and cost of a plan (means over samples in Monte-Carlo mode)."""

    plan: tuple[int, ...]
    jct_s: float
    cost: float
    compute_cost: float
    data_cost: float
    stages: tuple[StagePrediction, ...]
    samples: int = 0
    jct_std_s: float = 0.0
    cost_std: float = 0.0

    def meets(self, deadline_s: float) -> bool:
        return self.jct_s <= deadline_s + 1e-9


@lru_cache(maxsize=65536)
def step_time(trial: TrialModel, gpus: int, allreduce: AllreduceModel) -> float:
    """Seconds per optimizer step of the fixed global batch on ``gpus`` GPUs."""
    profile = trial.profile
    per_gpu = -(-trial.batch // gpus)
    accum = -(-per_gpu // profile.max_batch_per_gpu)
    micro = -(-trial.batch // (gpus * accum))
    compute = float(t_proc(profile, micro))
    if not math.isfinite(compute):
        return math.inf
    return (accum - 1) * compute + float(last_micro_step(compute, float(t_comm(allreduce, profile.num_params, gpus)), profile.overlap))


@lru_cache(maxsize=65536)
def layout(stage: Stage, gpus: int, trial: TrialModel, cloud: CloudModel, *, scattered: bool = False) -> StageLayout:
    per_instance = cloud.instance.gpus
    if gpus >= stage.trials:
        g, parallel = min(gpus // stage.trials, trial.max_gpus_per_trial), stage.trials
    else:
        g, parallel = 1, gpus
    instances = -(-gpus // per_instance)
    spans = stage_spans(parallel, g, instances, per_instance, scattered)
    return StageLayout(gpus, g, parallel, -(-stage.trials // parallel), instances, sum(1 for s in spans if s > 1))


class ModelTables:
    """Per-spec memo of stage layouts and step times, keyed by plain integers.

    The planners score thousands of plans of one spec; hashing the frozen spec objects on
    every lookup would cost more than the model itself.
    """

    __slots__ = ("spec", "scattered", "_layouts", "_steps", "_inter", "_intra")

    def __init__(self, spec: HpoSpec, scattered: bool = False) -> None:
        self.spec, self.scattered = spec, scattered
        self._layouts: dict[tuple[int, int], StageLayout] = {}
        self._steps: dict[tuple[int, bool], float] = {}
        self._intra = spec.trial.profile.allreduce
        self._inter = spec.cloud.instance.inter_node_allreduce or self._intra

    def layout(self, index: int, gpus: int) -> StageLayout:
        key = (index, gpus)
        hit = self._layouts.get(key)
        if hit is None:
            hit = self._layouts[key] = layout(self.spec.stages[index], gpus, self.spec.trial, self.spec.cloud, scattered=self.scattered)
        return hit

    def step(self, gpus: int, split: bool) -> float:
        key = (gpus, split)
        hit = self._steps.get(key)
        if hit is None:
            hit = self._steps[key] = step_time(self.spec.trial, gpus, self._inter if split else self._intra)
        return hit


def check_plan(spec: HpoSpec, plan: Sequence[int]) -> tuple[int, ...]:
    plan = tuple(plan)
    if len(plan) != len(spec.stages):
        raise ValueError(f"plan={list(plan)!r}: has {len(plan)} entries for {len(spec.stages)} stages")
    for i, a in enumerate(plan):
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool) or not 1 <= a <= spec.cloud.max_gpus:
            raise ValueError(f"plan[{i}]={a!r}: must be an integer in [1, {spec.cloud.max_gpus}] (max_instances x GPUs per instance)")
    return tuple(int(a) for a in plan)


def predict(
    spec: HpoSpec,
    plan: Sequence[int],
    *,
    samples: int = 0,
    rng: np.random.Generator | None = None,
    scattered: bool = False,
    tables: ModelTables | None = None,
) -> Prediction:
    """JCT and cost of running ``spec`` with ``plan[i]`` GPUs in stage i.

    ``samples=0``: deterministic (means). ``samples>0``: Monte-Carlo over ``rng``.
    ``scattered``: place trial workers without locality (the ablation baseline).
    """
    plan = check_plan(spec, plan)
    tables = tables if tables is not None and tables.spec is spec and tables.scattered == scattered else ModelTables(spec, scattered)
    if samples < 0:
        raise ValueError(f"samples={samples}: must be >= 0")
    if samples > 0 and rng is None:
        raise ValueError("rng: Monte-Carlo mode (samples > 0) needs an explicit numpy Generator")
    layouts = tuple(tables.layout(i, a) for i, a in enumerate(plan))
    if samples == 0:
        return _run(spec, plan, layouts, tables, None)
    runs = [_run(spec, plan, layouts, tables, rng) for _ in range(samples)]
    jcts = np.array([r.jct_s for r in runs])
    costs = np.array([r.cost for r in runs])
    return Prediction(
        plan=plan,
        jct_s=float(jcts.mean()),
        cost=float(costs.mean()),
        compute_cost=float(np.mean([r.compute_cost for r in runs])),
        data_cost=float(np.mean([r.data_cost for r in runs])),
        stages=runs[0].stages,
        samples=samples,
        jct_std_s=float(jcts.std()),
        cost_std=float(costs.std()),
    )


def _run(
    spec: HpoSpec, plan: tuple[int, ...], layouts: tuple[StageLayout, ...], tables: ModelTables, rng: np.random.Generator | None
) -> Prediction:
    cloud, trial = spec.cloud, spec.trial
    gpu_price_s = cloud.instance.price_per_s / cloud.instance.gpus
    t = 0.0
    up: list[float] = []  # billing start of each instance that is up, oldest first
    compute = data = 0.0
    stage_out = []
    for stage, lay in zip(spec.stages, layouts):
        if lay.instances > len(up):
            new = lay.instances - len(up)
            data += new * cloud.data_gb * cloud.data_price_per_gb
            if rng is None:
                up.extend([t + cloud.provision.mean_s] * new)
                t += cloud.provision.mean_s + cloud.init.mean_s
            else:
                prov = np.asarray(cloud.provision.sample(rng, new), dtype=float)
                init = np.asarray(cloud.init.sample(rng, new), dtype=float)
                up.extend((t + prov).tolist())
                t += float(np.max(prov + init))
        elif lay.instances < len(up):
            if cloud.billing is Billing.PER_INSTANCE:
                compute += _charge_all(cloud, t, up[lay.instances :])
            del up[lay.instances :]
        start = t
        fast = tables.step(lay.gpus_per_trial, False)
        slow = tables.step(lay.gpus_per_trial, True) if lay.split_trials else fast
        if rng is None:
            # Deterministic: equal trials, so the slowest slot (split trials run their waves
            # too; queued trials only happen at 1 GPU each, never split) sets the stage time.
            stage_time = 0.0
            for step, slots in ((slow, lay.split_trials), (fast, lay.parallel - lay.split_trials)):
                if slots:
                    dur = trial.startup.mean_s + stage.iters * step
                    stage_time = max(stage_time, lay.waves * dur)
                    if cloud.billing is Billing.PER_FUNCTION:
                        runs_here = min(stage.trials, slots * lay.waves)
                        compute += cloud.charge(dur) * runs_here * lay.gpus_per_trial * gpu_price_s
        else:
            # Slots 0..split-1 hold the split trials: which ones does not matter, they are alike.
            slot_step = [slow] * lay.split_trials + [fast] * (lay.parallel - lay.split_trials)
            runs = _stage_runs(stage, lay, trial, slot_step, rng)
            stage_time = max(end for end, _ in runs)
            if cloud.billing is Billing.PER_FUNCTION:
                compute += sum(cloud.charge(d) for _, d in runs) * lay.gpus_per_trial * gpu_price_s
        t = start + stage_time
        stage_out.append(StagePrediction(lay, start, t, fast))
        t += trial.sync.mean_s if rng is None else float(trial.sync.sample(rng))
    if cloud.billing is Billing.PER_INSTANCE:
        compute += _charge_all(cloud, t, up)
    return Prediction(plan, t, compute + data, compute, data, tuple(stage_out))


def _charge_all(cloud: CloudModel, release: float, starts: list[float]) -> float:
    """Dollars for instances started at ``starts`` and released together (runs of equal starts charged once)."""
    total, k = 0.0, 0
    while k < len(starts):
        j = k
        while j < len(starts) and starts[j] == starts[k]:
            j += 1
        total += cloud.charge(release - starts[k]) * (j - k)
        k = j
    return total * cloud.instance.price_per_s


def _stage_runs(stage: Stage, lay: StageLayout, trial: TrialModel, slot_step: list[float], rng: np.random.Generator) -> list[tuple[float, float]]:
    """(end time from stage start, duration) of every trial run in a stage, drawn from ``rng``."""
    startup = np.asarray(trial.startup.sample(rng, stage.trials), dtype=float)
    noise = np.maximum(rng.normal(1.0, trial.iter_cv, stage.trials), _MIN_NOISE_FACTOR) if trial.iter_cv > 0 else np.ones(stage.trials)
    if lay.parallel >= stage.trials:
        durs = startup + stage.iters * np.asarray(slot_step) * noise
        return [(float(d), float(d)) for d in durs]
    heap = [(0.0, slot) for slot in range(lay.parallel)]
    runs = []
    for k in range(stage.trials):
        free_at, slot = heapq.heappop(heap)
        dur = float(startup[k] + stage.iters * slot_step[slot] * noise[k])
        runs.append((free_at + dur, dur))
        heapq.heappush(heap, (free_at + dur, slot))
    return runs


def static_plan(spec: HpoSpec, gpus: int) -> tuple[int, ...]:
    """The same GPUs in every stage: a fixed-size cluster shared fairly within each stage."""
    return (gpus,) * len(spec.stages)


def feasible(prediction: Prediction, spec: HpoSpec) -> bool:
    return prediction.meets(spec.deadline_s) and math.isfinite(prediction.cost)


@dataclass(frozen=True, slots=True)
class MeasuredStage:
    """What a real run measured for one stage: when it began, the instances it held, and the
    wall time of each trial run (for per-function billing)."""

    start_s: float
    instances: int
    gpus_per_trial: int
    run_durations_s: tuple[float, ...]


def measured_cost(cloud: CloudModel, stages: Sequence[MeasuredStage], end_s: float) -> float:
    """The bill for a run that really happened, by the same rules the model predicts with.

    Instances are taken to come up when their stage began (a running cluster has no
    provisioning to measure) and to be released when a stage that needs fewer begins, or at
    ``end_s``.
    """
    up: list[float] = []
    compute = 0.0
    provisioned = 0
    gpu_price_s = cloud.instance.price_per_s / cloud.instance.gpus
    for stage in stages:
        if stage.instances > len(up):
            provisioned += stage.instances - len(up)
            up.extend([stage.start_s] * (stage.instances - len(up)))
        elif stage.instances < len(up):
            if cloud.billing is Billing.PER_INSTANCE:
                compute += _charge_all(cloud, stage.start_s, up[stage.instances :])
            del up[stage.instances :]
        if cloud.billing is Billing.PER_FUNCTION:
            compute += sum(cloud.charge(d) for d in stage.run_durations_s) * stage.gpus_per_trial * gpu_price_s
    if cloud.billing is Billing.PER_INSTANCE:
        compute += _charge_all(cloud, end_s, up)
    return compute + provisioned * cloud.data_gb * cloud.data_price_per_gb
