"""What an HPO job is (seed 001, RubberBand): stages of trials, how a trial trains, the cloud.

A successive-halving job is a list of ``Stage``s known before it runs (that is what lets us
plan it offline). Each stage runs ``trials`` trials for ``iters`` more optimizer steps at the
job's fixed global batch (strong scaling: the batch never follows the GPU count, so the
system cannot change the learning dynamics), then keeps the best ``trials`` of the next stage.

Every type is a frozen, slotted dataclass validated at construction; a bad value raises
``ValueError`` naming the field and the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from allocator.types import AllreduceModel, ThroughputProfile


def _req(ok: bool, owner: str, name: str, value: object, why: str) -> None:
    if not ok:
        raise ValueError(f"{owner}.{name}={value!r}: {why}")


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _pos_int(owner: str, name: str, v: object) -> None:
    _req(isinstance(v, int) and not isinstance(v, bool) and v > 0, owner, name, v, "must be a positive integer")


def _nonneg(owner: str, name: str, v: object) -> None:
    _req(_is_num(v) and v >= 0, owner, name, v, "must be a finite number >= 0")


def _pos(owner: str, name: str, v: object) -> None:
    _req(_is_num(v) and v > 0, owner, name, v, "must be a finite number > 0")


@dataclass(frozen=True, slots=True)
class Stage:
    """``trials`` trials each train ``iters`` more steps; then the stage ends at a barrier."""

    trials: int
    iters: int

    def __post_init__(self) -> None:
        _pos_int("Stage", "trials", self.trials)
        _pos_int("Stage", "iters", self.iters)


def successive_halving(num_trials: int, eta: int, min_iters: int, max_iters: int) -> tuple[Stage, ...]:
    """SHA(n, r, R, eta) as the paper specifies it: stage i keeps floor(n / eta^i) trials
    and trains each for r * eta^i more steps; the last stage (one trial left, or the budget
    reached) trains up to R in total.

    The paper's Table 3, SHA(32, 1, 50, 3), gives trials 32, 10, 3, 1 over epoch ranges
    0-1, 1-4, 4-13, 13-50; its SHA(64, 4, 508, 2) reaches exactly 508 = 4 * (2^7 - 1).
    """
    _pos_int("successive_halving", "num_trials", num_trials)
    _req(isinstance(eta, int) and not isinstance(eta, bool) and eta >= 2, "successive_halving", "eta", eta, "must be an integer >= 2")
    _pos_int("successive_halving", "min_iters", min_iters)
    _pos_int("successive_halving", "max_iters", max_iters)
    _req(max_iters >= min_iters, "successive_halving", "max_iters", max_iters, f"is below min_iters={min_iters}")
    stages: list[Stage] = []
    done, trials, add = 0, num_trials, min_iters
    while True:
        goal = done + add
        last = trials // eta < 1 or goal + add * eta > max_iters
        if last:
            goal = max(goal, max_iters)
        stages.append(Stage(trials, goal - done))
        if last:
            return tuple(stages)
        done, trials, add = goal, trials // eta, add * eta


class Billing(str, Enum):
    """Per-instance: pay for every instance from boot to release. Per-function: pay only the GPU-seconds trials use."""

    PER_INSTANCE = "per_instance"
    PER_FUNCTION = "per_function"


@dataclass(frozen=True, slots=True)
class Latency:
    """A latency: its mean, and a coefficient of variation used only in Monte-Carlo mode."""

    mean_s: float = 0.0
    cv: float = 0.0

    def __post_init__(self) -> None:
        _nonneg("Latency", "mean_s", self.mean_s)
        _nonneg("Latency", "cv", self.cv)

    def sample(self, rng: np.random.Generator | None, size: int | None = None) -> float | np.ndarray:
        """The mean (deterministic mode, rng None) or Normal(mean, cv*mean) clipped at 0."""
        if rng is None or self.cv == 0.0 or self.mean_s == 0.0:
            return self.mean_s if size is None else np.full(size, self.mean_s)
        draw = rng.normal(self.mean_s, self.cv * self.mean_s, size)
        return np.maximum(draw, 0.0) if size is not None else max(float(draw), 0.0)


@dataclass(frozen=True, slots=True)
class InstanceType:
    """A cloud instance: GPUs on it, its hourly price, and the network between instances.

    ``inter_node_allreduce`` is the ring-allreduce fit across instances; a trial whose
    workers span instances pays it instead of the profile's (intra-node) fit. None means
    crossing instances costs nothing extra.
    """

    name: str
    gpus: int
    hourly_price: float
    inter_node_allreduce: AllreduceModel | None = None

    def __post_init__(self) -> None:
        _req(isinstance(self.name, str) and self.name != "", "InstanceType", "name", self.name, "must be a non-empty string")
        _pos_int(f"InstanceType[{self.name}]", "gpus", self.gpus)
        _pos(f"InstanceType[{self.name}]", "hourly_price", self.hourly_price)

    @property
    def price_per_s(self) -> float:
        return self.hourly_price / 3600.0


@dataclass(frozen=True, slots=True)
class CloudModel:
    """How the provider provisions and bills.

    ``provision``: request -> instance running (the provider's queue; not billed).
    ``init``: running -> ready for the job (dependencies, joining the cluster; billed).
    A billed span is charged ``max(min_charge_s, ceil(span / granularity_s) * granularity_s)``
    — per instance lifetime under per-instance billing, per trial run under per-function.
    ``data_gb`` is downloaded once by every instance the job provisions, at ``data_price_per_gb``.
    """

    instance: InstanceType
    billing: Billing = Billing.PER_INSTANCE
    granularity_s: float = 1.0
    min_charge_s: float = 60.0
    provision: Latency = Latency()
    init: Latency = Latency()
    max_instances: int = 64
    data_gb: float = 0.0
    data_price_per_gb: float = 0.0

    def __post_init__(self) -> None:
        _req(isinstance(self.instance, InstanceType), "CloudModel", "instance", self.instance, "must be an InstanceType")
        _req(isinstance(self.billing, Billing), "CloudModel", "billing", self.billing, "must be per_instance or per_function")
        _pos("CloudModel", "granularity_s", self.granularity_s)
        _nonneg("CloudModel", "min_charge_s", self.min_charge_s)
        _pos_int("CloudModel", "max_instances", self.max_instances)
        _nonneg("CloudModel", "data_gb", self.data_gb)
        _nonneg("CloudModel", "data_price_per_gb", self.data_price_per_gb)

    @property
    def max_gpus(self) -> int:
        return self.max_instances * self.instance.gpus

    def charge(self, span_s: float) -> float:
        """Seconds billed for a span: rounded up to the granularity, at least the minimum charge."""
        if span_s <= 0.0:
            return 0.0
        # The epsilon keeps an exact multiple (e.g. 120.0 at 60 s granularity) from rounding up.
        units = math.ceil(span_s / self.granularity_s - 1e-9)
        return max(self.min_charge_s, units * self.granularity_s)


@dataclass(frozen=True, slots=True)
class TrialModel:
    """How one trial trains: its profile, its fixed global batch, and its latencies.

    ``startup`` is paid by every trial run on (re)placement: loading the checkpoint and
    connecting its workers. ``iter_cv`` is the Monte-Carlo spread of a trial run's
    per-iteration time (drawn once per run: a straggler stays a straggler). ``sync`` is the
    end-of-stage barrier (evaluation, ranking).
    """

    profile: ThroughputProfile
    batch: int
    startup: Latency = Latency()
    sync: Latency = Latency()
    iter_cv: float = 0.0
    max_gpus_per_trial: int | None = None

    def __post_init__(self) -> None:
        _req(isinstance(self.profile, ThroughputProfile), "TrialModel", "profile", self.profile, "must be a ThroughputProfile")
        _pos_int("TrialModel", "batch", self.batch)
        _nonneg("TrialModel", "iter_cv", self.iter_cv)
        if self.max_gpus_per_trial is None:
            object.__setattr__(self, "max_gpus_per_trial", self.batch)
        _pos_int("TrialModel", "max_gpus_per_trial", self.max_gpus_per_trial)
        _req(
            self.max_gpus_per_trial <= self.batch,
            "TrialModel",
            "max_gpus_per_trial",
            self.max_gpus_per_trial,
            f"exceeds batch={self.batch} (every GPU needs a sample)",
        )


class ParamKind(str, Enum):
    UNIFORM = "uniform"
    LOGUNIFORM = "loguniform"
    INT = "int"
    CHOICE = "choice"


@dataclass(frozen=True, slots=True)
class SearchParam:
    """One hyperparameter's distribution: uniform/loguniform/int over [low, high], or a choice."""

    name: str
    kind: ParamKind
    low: float = 0.0
    high: float = 0.0
    choices: tuple[object, ...] = ()

    def __post_init__(self) -> None:
        owner = f"search_space.{self.name}"
        _req(isinstance(self.name, str) and self.name != "", "SearchParam", "name", self.name, "must be a non-empty string")
        _req(isinstance(self.kind, ParamKind), owner, "kind", self.kind, "must be uniform, loguniform, int or choice")
        object.__setattr__(self, "choices", tuple(self.choices))
        if self.kind is ParamKind.CHOICE:
            _req(len(self.choices) > 0, owner, "choices", self.choices, "must be a non-empty list")
            return
        _req(_is_num(self.low), owner, "low", self.low, "must be a finite number")
        _req(_is_num(self.high) and self.high >= self.low, owner, "high", self.high, f"must be a finite number >= low={self.low}")
        if self.kind is ParamKind.LOGUNIFORM:
            _req(self.low > 0, owner, "low", self.low, "must be > 0 for loguniform")

    def sample(self, rng: np.random.Generator) -> object:
        if self.kind is ParamKind.CHOICE:
            return self.choices[int(rng.integers(len(self.choices)))]
        if self.kind is ParamKind.INT:
            return int(rng.integers(math.ceil(self.low), math.floor(self.high) + 1))
        if self.kind is ParamKind.LOGUNIFORM:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))


@dataclass(frozen=True, slots=True)
class HpoSpec:
    """A whole HPO job: stages, trial model, cloud, deadline, search space, and what to train for real.

    ``entrypoint`` (``pkg.mod:fn`` returning a TrainingRecipe) is only needed to run the
    plan; planning uses the profile alone. ``seed`` seeds configuration sampling.
    """

    name: str
    stages: tuple[Stage, ...]
    trial: TrialModel
    cloud: CloudModel
    deadline_s: float
    search_space: tuple[SearchParam, ...] = ()
    entrypoint: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        _req(isinstance(self.name, str) and self.name != "", "HpoSpec", "name", self.name, "must be a non-empty string")
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "search_space", tuple(self.search_space))
        _req(len(self.stages) > 0, "HpoSpec", "stages", self.stages, "must hold at least one stage")
        for i, (a, b) in enumerate(zip(self.stages, self.stages[1:])):
            _req(b.trials <= a.trials, "HpoSpec", f"stages[{i + 1}].trials", b.trials, f"exceeds the previous stage's {a.trials} trials")
        _pos("HpoSpec", "deadline_s", self.deadline_s)
        names = [p.name for p in self.search_space]
        dupes = sorted({n for n in names if names.count(n) > 1})
        _req(not dupes, "HpoSpec", "search_space", dupes, "parameter names must be unique")
        _req(isinstance(self.seed, int) and not isinstance(self.seed, bool), "HpoSpec", "seed", self.seed, "must be an integer")

    def sample_configs(self) -> tuple[dict[str, object], ...]:
        """One configuration per first-stage trial, drawn from ``seed`` (same seed -> same configs)."""
        rng = np.random.default_rng(self.seed)
        return tuple({p.name: p.sample(rng) for p in self.search_space} for _ in range(self.stages[0].trials))
