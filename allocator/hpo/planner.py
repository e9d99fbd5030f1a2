"""Plans: the static baseline, RubberBand's greedy planner, and an exhaustive search (seed 001 §3.2, §4.3).

* ``static_baseline``: the cheapest fixed cluster (whole instances, 1..max_instances) whose
  predicted JCT meets the deadline — the paper's baseline and the greedy's warm start.
* ``greedy_plan``: Algorithm 2. From a feasible warm start, repeatedly lower one stage's GPUs
  by the smallest step that keeps them a factor or a multiple of the stage's trials (so they
  divide fairly), and take the candidate with the best cost saved per second of JCT added,
  among those that still meet the deadline; stop when none saves more than ``min_saving``.
  Whole-instance sizes are candidates too (our addition: under per-instance billing a stage
  pays for whole instances, so a size between factors can be the cheap one). Warm starts: the static optimum and 2x, 3x its size (as the paper does), plus a plan
  built up from the cheapest one: start at 1 GPU per stage and raise the stage with the most
  JCT saved per cost added until the deadline is met; and when neither is feasible, the
  fastest plan a coordinate search finds.
* ``exhaustive_plan``: every combination of allowed stage sizes, with no thinning of the
  ladder; for checking the greedy on small cases.

All planning uses the model in one mode: deterministic by default, or Monte-Carlo with
``samples`` and a fixed ``seed`` (each candidate is scored with the same random stream —
common random numbers — so candidates are compared on the same draws).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from allocator.hpo.model import ModelTables, Prediction, predict, static_plan
from allocator.hpo.spec import HpoSpec


class NoFeasiblePlanError(Exception):
    """No plan searched meets the deadline."""


@dataclass(frozen=True, slots=True)
class PlanResult:
    """The chosen plan's prediction, how it was found, and how many plans were scored."""

    prediction: Prediction
    method: str
    evaluations: int


class Scorer:
    """Scores plans with one model mode; memoises, and counts the model runs."""

    __slots__ = ("spec", "samples", "seed", "_cache", "_tables")

    def __init__(self, spec: HpoSpec, samples: int = 0, seed: int = 0) -> None:
        self.spec, self.samples, self.seed = spec, samples, seed
        self._cache: dict[tuple[int, ...], Prediction] = {}
        self._tables = ModelTables(spec)

    def __call__(self, plan: tuple[int, ...]) -> Prediction:
        hit = self._cache.get(plan)
        if hit is None:
            # Common random numbers: every plan sees the same stream.
            rng = np.random.default_rng(self.seed) if self.samples else None
            hit = predict(self.spec, plan, samples=self.samples, rng=rng, tables=self._tables)
            self._cache[plan] = hit
        return hit

    @property
    def evaluations(self) -> int:
        return len(self._cache)

    def ok(self, p: Prediction) -> bool:
        return p.meets(self.spec.deadline_s)


def _ladder(limit: int) -> list[int]:
    """1..8, then numbers with three significant bits (10, 12, 14, 16, 20, 24, 28, 32, 40, ...):
    fine where a step matters, geometric where it does not, so large jobs plan in well under
    a second."""
    out, step, n = [], 1, 1
    while n <= limit:
        out.append(n)
        if n >= 8 * step:
            step *= 2
        n += step
    return out


def allowed_sizes(trials: int, max_gpus: int, max_per_trial: int, gpus_per_instance: int = 1, thin: bool = True) -> tuple[int, ...]:
    """Stage sizes the planners consider: the paper's factors and multiples of the trial count
    (they divide fairly; multiples on the ladder of GPUs per trial), plus whole instances on
    the ladder of instance counts (what per-instance billing charges for anyway).
    ``thin=False`` takes every multiple and every instance count instead of the ladder (the
    exhaustive search, which must not skip a size the static baseline tries)."""
    ladder = _ladder if thin else (lambda limit: list(range(1, limit + 1)))
    factors = [d for d in range(1, trials + 1) if trials % d == 0 and d <= max_gpus]
    multiples = [trials * g for g in ladder(max_per_trial) if g > 1 and trials * g <= max_gpus]
    whole = [n * gpus_per_instance for n in ladder(max_gpus // gpus_per_instance)]
    return tuple(sorted(set(factors) | set(multiples) | set(whole)))


def _sizes(spec: HpoSpec, thin: bool = True) -> list[tuple[int, ...]]:
    cloud = spec.cloud
    return [allowed_sizes(s.trials, cloud.max_gpus, spec.trial.max_gpus_per_trial, cloud.instance.gpus, thin) for s in spec.stages]


def static_baseline(spec: HpoSpec, scorer: Scorer | None = None) -> PlanResult:
    """The cheapest fixed cluster of whole instances that meets the deadline."""
    scorer = scorer or Scorer(spec)
    per = spec.cloud.instance.gpus
    best: Prediction | None = None
    for n in range(1, spec.cloud.max_instances + 1):
        p = scorer(static_plan(spec, n * per))
        if scorer.ok(p) and (best is None or p.cost < best.cost):
            best = p
    if best is None:
        fastest = min((scorer(static_plan(spec, n * per)) for n in range(1, spec.cloud.max_instances + 1)), key=lambda p: p.jct_s)
        raise NoFeasiblePlanError(
            f"deadline_s={spec.deadline_s}: no static cluster of up to {spec.cloud.max_instances} instances meets it "
            f"(fastest: {fastest.plan[0]} GPUs, JCT {fastest.jct_s:.0f} s)"
        )
    return PlanResult(best, "static", scorer.evaluations)


def _step(sizes: tuple[int, ...], current: int, down: bool) -> int | None:
    if down:
        lower = [s for s in sizes if s < current]
        return lower[-1] if lower else None
    higher = [s for s in sizes if s > current]
    return higher[0] if higher else None


def descend(spec: HpoSpec, start: tuple[int, ...], scorer: Scorer, min_saving: float = 1e-9) -> Prediction:
    """Algorithm 2 from a feasible ``start``: lower one stage at a time, best cost saved per JCT added."""
    sizes = _sizes(spec)
    best = scorer(start)
    while True:
        choice: tuple[float, Prediction] | None = None
        for i, a in enumerate(best.plan):
            # The smallest step down that changes the cost: with whole-instance billing, one
            # GPU less often costs the same (same instances), and the paper's single step
            # would stop there.
            cand = None
            for lower in reversed([s for s in sizes[i] if s < a]):
                probe = scorer(best.plan[:i] + (lower,) + best.plan[i + 1 :])
                if not scorer.ok(probe) or best.cost - probe.cost > min_saving:
                    cand = probe
                    break
            if cand is None:
                continue
            saving = best.cost - cand.cost
            if not scorer.ok(cand) or saving <= min_saving:
                continue
            added = cand.jct_s - best.jct_s
            merit = math.inf if added <= 0 else saving / added
            if choice is None or merit > choice[0] or (merit == choice[0] and cand.cost < choice[1].cost):
                choice = (merit, cand)
        if choice is None:
            return best
        best = choice[1]


def ascend(spec: HpoSpec, scorer: Scorer) -> Prediction | None:
    """From the cheapest plan (the fewest GPUs in every stage), raise the stage that buys the
    most JCT per unit of cost until the deadline is met; None if no single raise helps."""
    sizes = _sizes(spec)
    best = scorer(tuple(s[0] for s in sizes))
    while not scorer.ok(best):
        choice: tuple[float, Prediction] | None = None
        for i, a in enumerate(best.plan):
            higher = _step(sizes[i], a, down=False)
            if higher is None:
                continue
            cand = scorer(best.plan[:i] + (higher,) + best.plan[i + 1 :])
            gained = best.jct_s - cand.jct_s
            if gained <= 0:
                continue
            added = cand.cost - best.cost
            merit = math.inf if added <= 0 else gained / added
            if choice is None or merit > choice[0]:
                choice = (merit, cand)
        if choice is None:
            return None
        best = choice[1]
    return best


def fastest(spec: HpoSpec, scorer: Scorer) -> Prediction:
    """The (near-)fastest plan: from the fastest static cluster, set each stage in turn to
    its JCT-minimising size until no stage changes. JCT is a sum of stage times coupled only
    through scale-up latency, so this coordinate search lands on the fastest plan in the
    cases we checked; it is the warm start of last resort when nothing cheaper is feasible."""
    sizes = _sizes(spec)
    per = spec.cloud.instance.gpus
    best = min((scorer(static_plan(spec, n * per)) for n in range(1, spec.cloud.max_instances + 1)), key=lambda p: (p.jct_s, p.cost))
    changed = True
    while changed:
        changed = False
        for i in range(len(best.plan)):
            for a in sizes[i]:
                cand = scorer(best.plan[:i] + (a,) + best.plan[i + 1 :])
                if cand.jct_s < best.jct_s - 1e-9 or (abs(cand.jct_s - best.jct_s) <= 1e-9 and cand.cost < best.cost):
                    best, changed = cand, True
    return best


def refine(spec: HpoSpec, start: Prediction, scorer: Scorer, min_saving: float = 1e-9, reach: int = 2) -> Prediction:
    """Our addition after Algorithm 2: a local search over moves the one-way descent cannot
    make — one stage to any size, or two stages each up to ``reach`` sizes up or down (e.g. a
    bigger first stage that lets a later stage shrink) — taken while one lowers cost and
    keeps the deadline."""
    sizes = _sizes(spec)
    index = [{a: k for k, a in enumerate(s)} for s in sizes]
    best = start

    def near(i: int, a: int) -> list[int]:
        k = index[i].get(a)
        if k is None:
            return list(sizes[i])
        return [sizes[i][j] for j in range(max(0, k - reach), min(len(sizes[i]), k + reach + 1)) if j != k]

    improved = True
    while improved:
        improved = False
        plans = [best.plan[:i] + (a,) + best.plan[i + 1 :] for i in range(len(best.plan)) for a in sizes[i]]
        for i, j in itertools.combinations(range(len(best.plan)), 2):
            for a in near(i, best.plan[i]):
                for b in near(j, best.plan[j]):
                    plan = list(best.plan)
                    plan[i], plan[j] = a, b
                    plans.append(tuple(plan))
        for plan in plans:
            cand = scorer(plan)
            if scorer.ok(cand) and cand.cost < best.cost - min_saving:
                best, improved = cand, True
    return best


def greedy_plan(
    spec: HpoSpec, *, samples: int = 0, seed: int = 0, warm_multiples: tuple[int, ...] = (1, 2, 3), refined: bool = True
) -> PlanResult:
    """RubberBand's planner (then ``refine`` unless ``refined=False``); never worse than the
    static baseline it starts from."""
    scorer = Scorer(spec, samples, seed)
    starts: list[tuple[int, ...]] = []
    try:
        static = static_baseline(spec, scorer).prediction
        for m in warm_multiples:
            size = min(static.plan[0] * m, spec.cloud.max_gpus)
            if scorer.ok(scorer(static_plan(spec, size))):
                starts.append(static_plan(spec, size))
    except NoFeasiblePlanError:
        static = None
    built = ascend(spec, scorer)
    if built is not None:
        starts.append(built.plan)
    if not starts:
        quickest = fastest(spec, scorer)
        if scorer.ok(quickest):
            starts.append(quickest.plan)
    if not starts:
        raise NoFeasiblePlanError(f"deadline_s={spec.deadline_s}: neither a static cluster nor the greedy ascent meets it")
    results = [descend(spec, s, scorer) for s in dict.fromkeys(starts)]
    best = min(results, key=lambda p: (p.cost, p.jct_s))
    if refined:
        best = refine(spec, best, scorer)
    return PlanResult(best, "greedy+refine" if refined else "greedy", scorer.evaluations)


def exhaustive_plan(spec: HpoSpec, *, samples: int = 0, seed: int = 0, limit: int = 200_000) -> PlanResult:
    """The cheapest plan meeting the deadline over every combination of allowed stage sizes,
    none thinned out (every instance count, every multiple of the trials)."""
    sizes = _sizes(spec, thin=False)
    count = math.prod(len(s) for s in sizes)
    if count > limit:
        raise ValueError(f"exhaustive_plan: {count} plans exceed limit={limit}; use greedy_plan")
    scorer = Scorer(spec, samples, seed)
    best: Prediction | None = None
    for plan in itertools.product(*sizes):
        p = scorer(plan)
        if scorer.ok(p) and (best is None or (p.cost, p.jct_s) < (best.cost, best.jct_s)):
            best = p
    if best is None:
        raise NoFeasiblePlanError(f"deadline_s={spec.deadline_s}: no plan of {count} meets it")
    return PlanResult(best, "exhaustive", scorer.evaluations)

