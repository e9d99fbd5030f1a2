"""How many GPUs each team is entitled to now: its nominal share, and what it borrows.

Kueue's cohort, with weights for the lending: every team is guaranteed
``min(nominal, demand)``, where demand is the GPUs its jobs could use (each job's largest
count); the GPUs that leaves (quota nobody needs now, and capacity no quota names) are lent to
the teams whose demand exceeds their nominal share, highest priority class first, and within
a class so that each team's borrowed GPUs per unit of weight are as even as whole GPUs allow
(max-min). When the owner's demand comes back, the next decision computes its guarantee
again: the borrower's entitlement shrinks, and the fairness layer shrinks its jobs in place.

Every function here is integer arithmetic on team names; ties go to the name, so a decision
is the same on every run.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping

from allocator.fairness.teams import TeamTable


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """``total`` whole GPUs in proportion to ``weights`` (largest remainder; ties by name)."""
    out = {k: 0 for k in weights}
    mass = sum(w for w in weights.values() if w > 0)
    if total <= 0 or mass <= 0:
        return out
    exact = {k: total * max(w, 0.0) / mass for k, w in weights.items()}
    for k, v in exact.items():
        out[k] = int(math.floor(v))
    left = total - sum(out.values())
    for k in sorted(weights, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return out


def nominal_shares(table: TeamTable, capacity: int, names: Iterable[str]) -> dict[str, int]:
    """Each team's nominal GPUs on ``capacity``: its quota (all quotas scaled down together when they
    add up to more than the cluster has now), and for a team without one its weight's part of the
    GPUs the quotas leave."""
    teams = [table.team(n) for n in dict.fromkeys(names)]
    quotas = {t.name: t.quota for t in teams if t.quota is not None}
    asked = sum(quotas.values())
    if asked > capacity:
        fixed = apportion(capacity, {k: float(v) for k, v in quotas.items()})
    else:
        fixed = {k: int(v) for k, v in quotas.items()}
    rest = capacity - sum(fixed.values())
    weighted = apportion(rest, {t.name: t.weight for t in teams if t.quota is None})
    return {t.name: fixed[t.name] if t.name in fixed else weighted[t.name] for t in teams}


def water_fill(amount: int, caps: Mapping[str, int], weights: Mapping[str, float], level: Mapping[str, int]) -> dict[str, int]:
    """Up to ``amount`` GPUs, one at a time to the team whose ``(level + given + 1) / weight`` is
    least among those below their cap: weighted max-min over what each already has (``level``)."""
    given = {k: 0 for k in caps}
    heap = [((level.get(k, 0) + 1) / weights[k], k) for k, c in caps.items() if c > 0]
    heapq.heapify(heap)
    while amount > 0 and heap:
        _, k = heapq.heappop(heap)
        given[k] += 1
        amount -= 1
        if given[k] < caps[k]:
            heapq.heappush(heap, ((level.get(k, 0) + given[k] + 1) / weights[k], k))
    return given


def entitlements(
    capacity: int, nominal: Mapping[str, int], weights: Mapping[str, float], demand: Mapping[str, Mapping[int, int]]
) -> dict[str, int]:
    """GPUs per team: ``min(nominal, demand)`` guaranteed, the rest lent by priority class then weight.

    ``demand`` maps team -> priority -> GPUs its jobs of that priority could use. A team's
    guarantee covers its own highest classes first; what it asks beyond it, class by class, is
    what it may borrow. Sums to ``min(capacity, total demand)``; no team gets more than it asks.
    """
    teams = list(dict.fromkeys([*nominal, *demand]))
    asks = {t: sum(demand.get(t, {}).values()) for t in teams}
    out = {t: min(nominal.get(t, 0), asks[t]) for t in teams}
    left = capacity - sum(out.values())
    unmet: dict[int, dict[str, int]] = {}
    for t in teams:
        cover = out[t]
        for p in sorted(demand.get(t, {}), reverse=True):
            d = demand[t][p]
            c = min(cover, d)
            cover -= c
            if d > c:
                unmet.setdefault(p, {})[t] = d - c
    borrowed = {t: 0 for t in teams}
    for p in sorted(unmet, reverse=True):
        if left <= 0:
            break
        given = water_fill(left, unmet[p], {t: weights.get(t, 1.0) for t in unmet[p]}, borrowed)
        for t, g in given.items():
            out[t] += g
            borrowed[t] += g
            left -= g
    return out
