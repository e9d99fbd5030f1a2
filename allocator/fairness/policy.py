"""Fairness over people as an outer layer around any policy: each team's share, then the inner policy inside it.

At every decision (``FairShare``):

1. **Entitlements** (``allocator.fairness.shares``): per team, its nominal share while it has
   work for it, plus what it borrows of the GPUs other teams do not need now (lent by priority
   class, then weight).
2. **Preemption**, only where shrinking in place cannot reach them (``preempt``): a team whose
   jobs need more GPUs at their minimum than its entitlement (it borrowed by starting jobs, and
   the owner is back) gives up its lowest-priority, latest-started jobs until the rest fit; and a
   queued job of a higher class takes the place of lower-class running jobs of its own team. A
   preempted job goes back to the queue with its progress; everything else is reclaimed by
   shrinking in place.
3. **Admission** (``admit``): per team, class by class from the highest, the inner policy's own
   admission with the team's entitlement as the cluster.
4. **Allocation** (``allocate``): every job's minimum first; then a team's GPUs go to its classes
   from the highest, each class's GPUs given out by the inner policy (goodput_dp, elastic_dp, ...)
   as if that were the whole cluster. GPUs an inner policy leaves unused (its jobs are at their
   largest useful count) are lent on to classes that can use more: no GPU stays idle while a job
   could take it.

The same object runs in the simulator and the service: it is a ``Policy``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from allocator.admission import admit as admit_with
from allocator.fairness.shares import entitlements, nominal_shares, water_fill
from allocator.fairness.teams import TeamTable
from allocator.physics.choice import check_physics as check_inner_physics
from allocator.physics.throughput import baseline_rate
from allocator.protocols import AdmissionDecision, OverflowMode, Policy, SupportsMinGpus
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, RunningJob, Share

Group = tuple[str, int]  # (team, priority): the jobs an inner policy decides for together


@dataclass(frozen=True, slots=True)
class TeamView:
    """One decision's view of the teams: each job's team and GPU limits, each team's entitlement."""

    team_of: Mapping[str, str]
    limits: Mapping[str, tuple[int, int]]  # job -> (fewest GPUs it can run on under the inner policy, most it can use)
    nominal: Mapping[str, int]
    entitled: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class FairShare:
    """``inner`` decides inside each team's share; ``teams`` says who is in which team and what each
    is entitled to. ``strict_fifo``: the queue discipline of an inner policy without its own admission."""

    inner: Policy
    teams: TeamTable = field(default_factory=TeamTable)
    strict_fifo: bool = True
    name: str = ""
    # What a job alone can use, by everything that answer depends on: a decision asks it three
    # times (preempt, admit, allocate) on one snapshot.
    _useful: dict[tuple, int] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.teams, TeamTable):
            raise ValueError(f"fair.teams={self.teams!r}: must be a TeamTable")
        if getattr(self.inner, "name", "").startswith("idle_nodes"):
            raise ValueError(f"fair.inner={self.inner.name!r}: idle-node policies place on named nodes, which a team's share does not have")
        if not self.name:
            object.__setattr__(self, "name", f"{self.inner.name}+fair")

    # -- what the loop asks --------------------------------------------------------------------

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None:
        if isinstance(self.inner, SupportsMinGpus):
            return self.inner.min_gpus(job, capacity)
        least = job.min_gpus if job.elastic else job.requested_gpus
        return least if least <= capacity else None

    def check_physics(self, jobs: Sequence[JobSpec], gpus_per_host: int | None = None) -> None:
        check_inner_physics(self.inner, jobs, gpus_per_host)

    def view(self, snapshot: ClusterSnapshot, jobs: Sequence[JobSpec]) -> TeamView:
        """Teams, limits and entitlements for ``jobs`` (the demand) on the snapshot's capacity."""
        capacity = snapshot.capacity
        team_of = {j.id: self.teams.team_of(j) for j in jobs}
        running = {r.spec.id: r for r in snapshot.running}
        limits = {}
        for j in jobs:
            least = self.min_gpus(j, capacity)
            limits[j.id] = (capacity + 1, capacity) if least is None else (least, self._most_useful(snapshot, running.get(j.id) or RunningJob(j), least))
        demand: dict[str, dict[int, int]] = {}
        for j in jobs:
            least, most = limits[j.id]
            if least <= most:
                tiers = demand.setdefault(team_of[j.id], {})
                tiers[j.priority] = tiers.get(j.priority, 0) + most
        names = self.teams.names(jobs)
        nominal = nominal_shares(self.teams, capacity, names)
        weights = {n: self.teams.team(n).weight for n in names}
        return TeamView(team_of, limits, nominal, entitlements(capacity, nominal, weights, demand))

    def _most_useful(self, snapshot: ClusterSnapshot, job: RunningJob, least: int) -> int:
        """The GPUs the inner policy gives the job alone with all it may take: what it can use.
        A job's demand is that, not its largest count (past some count more GPUs may slow it,
        or it has too few samples per step to spread), so no team is lent GPUs it leaves idle."""
        j = job.spec
        # Every GPU needs at least one sample of the global batch: no more GPUs than that.
        top = min(snapshot.capacity, j.max_gpus, j.max_batch) if j.elastic else min(snapshot.capacity, j.requested_gpus)
        if top <= least:
            return top
        alone = job if job.share is not None and job.share.gpus <= top else replace(job, share=None)
        key = (snapshot.time, j, alone.share, alone.samples_done, alone.noise_scale, top, least)
        if key not in self._useful:
            if len(self._useful) > 4096:
                self._useful.clear()  # bounded: running jobs' progress makes new keys every decision
            try:
                share = self.inner.allocate(ClusterSnapshot(time=snapshot.time, capacity=top, running=(alone,))).get(j.id)
            except InfeasibleError:
                share = None
            self._useful[key] = max(least, share.gpus) if share is not None else least
        return self._useful[key]

    def preempt(self, snapshot: ClusterSnapshot) -> tuple[str, ...]:
        """Running jobs to take off the cluster: those of a team whose minimums exceed its entitlement,
        and those whose room a higher class of their own team needs (to start, or to grow to its
        largest count: a class above yields nothing to a class below). In a class the running jobs
        with the most work left go first (they lose least by waiting; SRPT's order), and a queued
        job never displaces a running one of its own class. Empty when shrinking in place is enough
        (the usual case)."""
        if not snapshot.running:
            return ()
        view = self.view(snapshot, snapshot.jobs)
        queued_ids = {q.id for q in snapshot.queued}
        left = {r.spec.id: r.remaining_samples / baseline_rate(r.spec) for r in snapshot.running}
        position = {j.id: i for i, j in enumerate(snapshot.jobs)}
        out = []
        for team in dict.fromkeys(view.team_of[r.spec.id] for r in snapshot.running):
            members = [j for j in snapshot.jobs if view.team_of[j.id] == team]
            budget = view.entitled.get(team, 0)
            levels = sorted({j.priority for j in members}, reverse=True)
            for level in levels:
                tier = sorted((j for j in members if j.priority == level), key=lambda j: (j.id in queued_ids, left.get(j.id, 0.0), position[j.id]))
                growth = 0
                for job in tier:
                    least, most = view.limits[job.id]
                    if least <= min(budget, most):
                        budget -= least
                        growth += most - least
                    elif job.id not in queued_ids:
                        out.append(job.id)
                if level != levels[-1]:
                    budget -= min(budget, growth)  # the class grows before the classes below keep their minimum
        return tuple(out)

    def admit(self, snapshot: ClusterSnapshot, mode: OverflowMode) -> AdmissionDecision:
        """Per team, class by class from the highest: the inner policy's admission on the team's entitlement."""
        view = self.view(snapshot, snapshot.jobs)
        admitted: set[str] = set()
        dropped: set[str] = set()
        for team in dict.fromkeys(view.team_of[q.id] for q in snapshot.queued):
            current = [RunningJob(r.spec, None, r.samples_done, r.noise_scale, r.measured) for r in snapshot.running if view.team_of[r.spec.id] == team]
            queued = [q for q in snapshot.queued if view.team_of[q.id] == team]
            for level in sorted({q.priority for q in queued}, reverse=True):
                tier = tuple(q for q in queued if q.priority == level)
                # What the classes above may grow into is not this class's to start jobs in.
                above = sum(view.limits[r.spec.id][1] - view.limits[r.spec.id][0] for r in current if r.spec.priority > level)
                room = max(0, view.entitled.get(team, 0) - above)
                sub = ClusterSnapshot(time=snapshot.time, capacity=room, running=tuple(current), queued=tier)
                decision = admit_with(sub, self.inner, mode, self.strict_fifo)
                current += [RunningJob(j) for j in decision.admitted]
                admitted |= {j.id for j in decision.admitted}
                dropped |= {j.id for j in decision.dropped}
        return AdmissionDecision(
            tuple(q for q in snapshot.queued if q.id in admitted),
            tuple(q for q in snapshot.queued if q.id not in admitted and q.id not in dropped),
            tuple(q for q in snapshot.queued if q.id in dropped),
        )

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        jobs = snapshot.jobs
        if not jobs:
            return Allocation()
        view = self.view(snapshot, jobs)
        for j in jobs:
            least, most = view.limits[j.id]
            if least > most:
                raise InfeasibleError(f"job {j.id!r} cannot run on {snapshot.capacity} GPUs under {self.inner.name}")
        if sum(view.limits[j.id][0] for j in jobs) > snapshot.capacity:
            raise InfeasibleError(f"{len(jobs)} jobs need more GPUs at their minimum than the cluster's {snapshot.capacity}")
        members = _groups(snapshot, view)
        entitled = _room_for_minimums(view, members)
        caps = _split_by_class(view, members, entitled)
        shares: dict[Group, Allocation] = {g: self._solve(snapshot, members[g], caps[g]) for g in members}
        self._lend_unused(snapshot, view, members, caps, shares)
        out = {jid: s for alloc in shares.values() for jid, s in alloc.shares}
        return Allocation(tuple((j.id, out[j.id]) for j in jobs if j.id in out))

    # -- inside ----------------------------------------------------------------------------------

    def _solve(self, snapshot: ClusterSnapshot, members: list[RunningJob], cap: int) -> Allocation:
        """The inner policy on one group, ``cap`` GPUs as its cluster. A running job keeps its share in
        the view while the group's shares fit ``cap`` (rescale-aware policies price the change);
        past that (the group is shrinking) the rest are shown without one."""
        waiting = {q.id for q in snapshot.queued}
        running, queued, held = [], [], 0
        for r in members:
            if r.spec.id in waiting:
                queued.append(r.spec)
            elif r.share is not None and held + r.share.gpus <= cap:
                running.append(r)
                held += r.share.gpus
            else:
                running.append(replace(r, share=None))
        return self.inner.allocate(ClusterSnapshot(time=snapshot.time, capacity=cap, running=tuple(running), queued=tuple(queued)))

    def _lend_unused(self, snapshot: ClusterSnapshot, view: TeamView, members: dict[Group, list[RunningJob]], caps: dict[Group, int], shares: dict[Group, Allocation]) -> None:
        """GPUs a group's inner policy left unused go to groups that used all theirs and could use
        more (highest class first, then team weight): work conservation across teams."""
        most = {g: sum(view.limits[r.spec.id][1] for r in ms) for g, ms in members.items()}
        for _ in range(len(members) + 1):
            pool = snapshot.capacity - sum(a.total_gpus for a in shares.values())
            hungry = {g: most[g] - caps[g] for g in members if shares[g].total_gpus >= caps[g] and most[g] > caps[g]}
            if pool <= 0 or not hungry:
                return
            grown = False
            for level in sorted({g[1] for g in hungry}, reverse=True):
                if pool <= 0:
                    break
                asks = {g[0]: hungry[g] for g in hungry if g[1] == level}
                level_now = {t: sum(c for g, c in caps.items() if g[0] == t) for t in asks}
                given = water_fill(pool, asks, {t: self.teams.team(t).weight for t in asks}, level_now)
                for team, extra in given.items():
                    if extra:
                        g = (team, level)
                        caps[g] += extra
                        pool -= extra
                        shares[g] = self._solve(snapshot, members[g], caps[g])
                        grown = True
            if not grown:
                return


@dataclass(frozen=True, slots=True)
class FairShareNoise(FairShare):
    """``FairShare`` around a goodput policy: the loop and the executor ask it for each job's noise scale."""

    def noise_scale(self, job: JobSpec, samples_done: float, reported: float | None = None) -> float:
        return self.inner.noise_scale(job, samples_done, reported)  # type: ignore[attr-defined]


def fair(inner: Policy, teams: TeamTable, strict_fifo: bool = True) -> FairShare:
    """``inner`` inside each team's share: the one way to wrap a policy (a goodput policy keeps its noise model)."""
    if isinstance(inner, FairShare):
        raise ValueError(f"fair.inner={inner.name!r}: already fair")
    cls = FairShareNoise if callable(getattr(inner, "noise_scale", None)) else FairShare
    return cls(inner, teams, strict_fifo)


def _groups(snapshot: ClusterSnapshot, view: TeamView) -> dict[Group, list[RunningJob]]:
    """Every job (running, then queued as not yet running) under its (team, class), snapshot order kept."""
    out: dict[Group, list[RunningJob]] = {}
    for r in (*snapshot.running, *(RunningJob(q) for q in snapshot.queued)):
        out.setdefault((view.team_of[r.spec.id], r.spec.priority), []).append(r)
    return out


def _room_for_minimums(view: TeamView, members: dict[Group, list[RunningJob]]) -> dict[str, int]:
    """Entitlements raised where a team's jobs need more at their minimum (a decision before its
    preemption settles, or a policy used without the loop), taken from the teams that borrow most."""
    need: dict[str, int] = {}
    for (team, _), ms in members.items():
        need[team] = need.get(team, 0) + sum(view.limits[r.spec.id][0] for r in ms)
    out = {t: max(view.entitled.get(t, 0), need[t]) for t in need}
    excess = sum(out.values()) - sum(view.entitled.get(t, 0) for t in need)
    while excess > 0:
        spare = [t for t in out if out[t] > need[t] and out[t] > 0]
        donor = max(spare, key=lambda t: (out[t] - view.nominal.get(t, 0), t))
        out[donor] -= 1
        excess -= 1
    return out


def _split_by_class(view: TeamView, members: dict[Group, list[RunningJob]], entitled: Mapping[str, int]) -> dict[Group, int]:
    """A team's GPUs over its classes: every job's minimum, then the rest from the highest class down."""
    caps: dict[Group, int] = {}
    for team in dict.fromkeys(t for t, _ in members):
        groups = sorted((g for g in members if g[0] == team), key=lambda g: -g[1])
        lows = {g: sum(view.limits[r.spec.id][0] for r in members[g]) for g in groups}
        spare = entitled.get(team, 0) - sum(lows.values())
        for g in groups:
            room = sum(view.limits[r.spec.id][1] for r in members[g]) - lows[g]
            extra = min(max(spare, 0), room)
            caps[g] = lows[g] + extra
            spare -= extra
    return caps
