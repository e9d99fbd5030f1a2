"""Seed 003 (BFTrainer): the idle-node MILP as a PuLP model (build only; the policy in
``allocator/policies/idle_nodes_milp.py`` solves it with HiGHS and reads the answer back).

Two formulations with the same optimum:

* ``node`` — the paper's model (Sec. 3): binaries x_jn (node n serves trainer j), each
  node to at most one trainer (Eqn. 5), N_j = sum_n x_jn in {0} U [N_min, N_max]
  (Eqn. 3-4), no migration (Eqn. 6-10), scale-up/-down binaries (Eqn. 15) and the
  objective T_fwd * sum O_j(N_j) - sum O_j(C_j) R_j (Eqn. 16).
* ``count`` (default) — integer N_j per trainer and sum N_j <= |N|, then
  ``assign_nodes`` places them. The objective only depends on the counts and every
  count vector that fits can be placed without migration, so the optimum is the same
  with J instead of J x |N| decision variables.

Deviations from the paper, each exact, not approximate:

* The XOR auxiliaries u_jn of Eqn. 9 are affine in x_jn because a_jn is a constant
  (u = x where a = 0, 1 - x where a = 1), so they are substituted, not added as binaries;
  the big-M pair of Eqn. 10 becomes "removed <= C_j z_j, added <= N_max (1 - z_j)" with a
  per-node form x_jn >= 1 - z_j for current nodes (a tighter LP, same integer points).
* SOS2 (Eqn. 11-12) is ignored by HiGHS, so O_j is modelled as a concave LP (minimum of
  its segment lines) when the curve is concave, and otherwise with one binary per segment
  (a disaggregated convex-combination model, exact at integer N_j).
* Eqn. 4's y_l / y_u pair is the binary r_j (trainer runs) with N_min r_j <= N_j <= N_max r_j.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import pulp

from allocator.idle_nodes.model import Problem, Trainer


class Formulation(str, Enum):
    COUNT = "count"
    NODE = "node"


class PwlMode(str, Enum):
    HULL = "hull"  # segment binaries with the rescale regions folded in (tightest LP; default)
    AUTO = "auto"  # concave LP where the curve is concave, segment binaries otherwise; Eqn. 15 binaries
    BINARY = "binary"  # segment binaries always; Eqn. 15 binaries


@dataclass(slots=True)
class BuiltModel:
    """A PuLP problem plus handles to read the answer back (mutable: PuLP fills values in)."""

    problem: Problem
    formulation: Formulation
    lp: pulp.LpProblem
    counts: list[pulp.LpAffineExpression | pulp.LpVariable]
    x: list[dict[str, pulp.LpVariable]] = field(default_factory=list)


def _add_scaling(lp: pulp.LpProblem, j: int, t: Trainer, n_expr, pwl: PwlMode) -> pulp.LpAffineExpression:
    """Constrain n_expr to {0} U [nmin, nmax] and return an expression equal to O_j(n_expr)."""
    curve = t.curve.restricted(t.nmin, t.nmax)
    pts, vals = curve.nodes, curve.values
    if len(pts) == 1:
        run = lp.add_variable(f"run_{j}", cat=pulp.LpBinary)
        lp += n_expr == pts[0] * run, f"size_{j}"
        return vals[0] * run
    if pwl is PwlMode.AUTO and curve.is_concave:
        run = lp.add_variable(f"run_{j}", cat=pulp.LpBinary)
        lp += n_expr >= t.nmin * run, f"nmin_{j}"
        lp += n_expr <= t.nmax * run, f"nmax_{j}"
        f = lp.add_variable(f"o_{j}", lowBound=0)
        for i in range(1, len(pts)):
            slope = (vals[i] - vals[i - 1]) / (pts[i] - pts[i - 1])
            # homogenised in run, so run = 0 (n = 0) leaves f <= 0
            lp += f <= (vals[i - 1] - slope * pts[i - 1]) * run + slope * n_expr, f"seg_{j}_{i}"
        lp += f <= max(vals) * run, f"cap_{j}"
        return f
    segs, parts, value = [], [], []
    for i in range(1, len(pts)):
        s = lp.add_variable(f"s_{j}_{i}", cat=pulp.LpBinary)
        mu = lp.add_variable(f"mu_{j}_{i}", lowBound=0)
        lp += mu >= pts[i - 1] * s, f"mulo_{j}_{i}"
        lp += mu <= pts[i] * s, f"muhi_{j}_{i}"
        slope = (vals[i] - vals[i - 1]) / (pts[i] - pts[i - 1])
        segs.append(s)
        parts.append(mu)
        value.append((vals[i - 1] - slope * pts[i - 1]) * s + slope * mu)
    lp += pulp.lpSum(segs) <= 1, f"oneseg_{j}"
    lp += n_expr == pulp.lpSum(parts), f"n_is_mu_{j}"
    return pulp.lpSum(value)


def _add_hull(lp: pulp.LpProblem, j: int, t: Trainer, n_expr) -> tuple[pulp.LpAffineExpression, pulp.LpAffineExpression]:
    """O_j(N_j) and the rescale loss together, as one disjunction over segments.

    [N_min, N_max] is cut at C_j into "shrink" [N_min, C_j - 1], "stay" {C_j} and "grow"
    [C_j + 1, N_max]; each region is covered by the curve's segments, one binary each, and
    the region's loss O_j(C_j) R (Eqn. 13-14) rides on those binaries. Waiting (no segment
    chosen) costs O_j(C_j) R_dw when the trainer was running. The LP relaxation of this
    disaggregated model is the convex hull of every piece, so HiGHS closes most events at the
    root; the integer points, and so the optimum, are those of Eqn. 13-16.
    """
    c, rate_c = t.c, t.rate(t.c)
    curve = t.curve.restricted(t.nmin, t.nmax)
    if rate_c > 0 and t.nmin <= c <= t.nmax:
        regions = [(t.nmin, c - 1, rate_c * t.down_s), (c, c, 0.0), (c + 1, t.nmax, rate_c * t.up_s)]
    else:
        regions = [(t.nmin, t.nmax, 0.0)]
    wait_loss = rate_c * t.down_s if c > 0 else 0.0
    segs, parts, gain, loss = [], [], [], []
    for lo, hi, cost in regions:
        if lo > hi:
            continue
        pts = [lo, *(n for n in curve.nodes if lo < n < hi), hi] if hi > lo else [lo]
        pieces = list(zip(pts, pts[1:])) if len(pts) > 1 else [(lo, lo)]
        for a, b in pieces:
            k = len(segs)
            s = lp.add_variable(f"h_{j}_{k}", cat=pulp.LpBinary)
            va, vb = curve.value(a), curve.value(b)
            if b > a:
                mu = lp.add_variable(f"hm_{j}_{k}", lowBound=0)
                lp += mu >= a * s, f"hlo_{j}_{k}"
                lp += mu <= b * s, f"hhi_{j}_{k}"
                slope = (vb - va) / (b - a)
                gain.append((va - slope * a) * s + slope * mu)
                parts.append(mu)
            else:
                gain.append(va * s)
                parts.append(a * s)
            loss.append((cost - wait_loss) * s)
            segs.append(s)
    lp += pulp.lpSum(segs) <= 1, f"hone_{j}"
    lp += n_expr == pulp.lpSum(parts), f"hn_{j}"
    return pulp.lpSum(gain), pulp.lpSum(loss) + wait_loss


def _add_rescale(lp: pulp.LpProblem, j: int, t: Trainer, n_expr, big_m: int) -> pulp.LpAffineExpression:
    """Eqn. 15: z_u = 1 iff N_j > C_j, z_d = 1 iff N_j < C_j; returns the lost objective (Eqn. 14, 16)."""
    c = t.c
    zu = lp.add_variable(f"zu_{j}", cat=pulp.LpBinary)
    lp += n_expr <= c + (big_m - c) * zu, f"up_a_{j}"
    lp += n_expr >= (c + 1) * zu, f"up_b_{j}"
    loss = t.rate(c) * t.up_s * zu
    if c > 0:
        zd = lp.add_variable(f"zd_{j}", cat=pulp.LpBinary)
        lp += n_expr <= (c - 1) + (big_m - (c - 1)) * (1 - zd), f"dw_a_{j}"
        lp += n_expr >= c * (1 - zd), f"dw_b_{j}"
        loss = loss + t.rate(c) * t.down_s * zd
    return loss


def _add_objective_terms(lp, j: int, t: Trainer, n_expr, pwl: PwlMode, big_m: int, gain: list, loss: list) -> None:
    if pwl is PwlMode.HULL:
        g, l = _add_hull(lp, j, t, n_expr)
    else:
        g, l = _add_scaling(lp, j, t, n_expr, pwl), _add_rescale(lp, j, t, n_expr, big_m)
    gain.append(g)
    loss.append(l)


def _add_must_run(lp: pulp.LpProblem, problem: Problem, counts, must_run: frozenset[str]) -> None:
    """Trainers that may not wait (e.g. a user's guarantee): N_j >= N_min. Can make the model infeasible."""
    unknown = must_run - {t.job_id for t in problem.trainers}
    if unknown:
        raise ValueError(f"must_run={sorted(unknown)!r}: not trainers of this event")
    for j, t in enumerate(problem.trainers):
        if t.job_id in must_run:
            lp += counts[j] >= t.nmin, f"must_{j}"


def build_count_model(problem: Problem, pwl: PwlMode = PwlMode.HULL, must_run: frozenset[str] = frozenset()) -> BuiltModel:
    lp = pulp.LpProblem("bftrainer_count", pulp.LpMaximize)
    big_m = max(1, len(problem.nodes))
    counts, gain, loss = [], [], []
    for j, t in enumerate(problem.trainers):
        n = lp.add_variable(f"n_{j}", lowBound=0, upBound=min(t.nmax, big_m), cat=pulp.LpInteger)
        counts.append(n)
        _add_objective_terms(lp, j, t, n, pwl, big_m, gain, loss)
    lp += pulp.lpSum(counts) <= len(problem.nodes), "capacity"
    _add_must_run(lp, problem, counts, must_run)
    lp += problem.t_fwd * pulp.lpSum(gain) - pulp.lpSum(loss)
    return BuiltModel(problem, Formulation.COUNT, lp, counts)


def build_node_model(problem: Problem, pwl: PwlMode = PwlMode.HULL, must_run: frozenset[str] = frozenset()) -> BuiltModel:
    lp = pulp.LpProblem("bftrainer_node", pulp.LpMaximize)
    big_m = max(1, len(problem.nodes))
    x = [{n: lp.add_variable(f"x_{j}_{i}", cat=pulp.LpBinary) for i, n in enumerate(problem.nodes)} for j in range(len(problem.trainers))]
    counts, gain, loss = [], [], []
    for j, t in enumerate(problem.trainers):
        n_expr = pulp.lpSum(x[j].values())
        counts.append(n_expr)
        _add_objective_terms(lp, j, t, n_expr, pwl, big_m, gain, loss)
        if t.c > 0:
            # No migration: z = 0 -> keep every current node (grow or stay); z = 1 -> add none.
            z = lp.add_variable(f"shrink_{j}", cat=pulp.LpBinary)
            for node in t.current:
                lp += x[j][node] >= 1 - z, f"keep_{j}_{problem.nodes.index(node)}"
            current = set(t.current)
            lp += pulp.lpSum(v for node, v in x[j].items() if node not in current) <= t.nmax * (1 - z), f"noadd_{j}"
    for i, node in enumerate(problem.nodes):
        lp += pulp.lpSum(x[j][node] for j in range(len(problem.trainers))) <= 1, f"node_{i}"
    _add_must_run(lp, problem, counts, must_run)
    lp += problem.t_fwd * pulp.lpSum(gain) - pulp.lpSum(loss)
    return BuiltModel(problem, Formulation.NODE, lp, counts, x)


def build(
    problem: Problem, formulation: Formulation = Formulation.COUNT, pwl: PwlMode = PwlMode.HULL, must_run: frozenset[str] = frozenset()
) -> BuiltModel:
    builder = build_count_model if formulation is Formulation.COUNT else build_node_model
    return builder(problem, pwl, frozenset(must_run))
