"""How fair a run was: GPU-hours used vs entitled per team and submitter, finish-time fairness.

* **Entitled GPU-hours** of a team: the integral over time of ``min(nominal share, demand)``,
  demand being the GPUs its present jobs (arrived, not ended) could use — what its quota
  guarantees it. A submitter's: its team's, split evenly among the team's submitters with a job
  present at that instant. Used above entitled is borrowing; used below, a guarantee not met
  (or met late: a decision interval, a rescale).
* **Finish-time fairness** (Themis, NSDI'20): ρ = a job's JCT when sharing / its JCT in
  isolation, where isolation is its team's jobs alone on the team's nominal share, under the
  same inner policy and loop (simulated). ρ <= 1: the job did at least as well as its team's
  share would have let it. A team's max ρ and mean ρ, the run's max ρ.
* **Jain's index** over teams, of each team's mean 1/ρ (its speed relative to its fair share):
  1 when every team is served alike, 1/n when one team gets everything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from allocator.fairness.shares import nominal_shares
from allocator.fairness.teams import TeamTable
from allocator.loop import LoopResult
from allocator.metrics import gpu_seconds_by_job
from allocator.types import JobSpec


@dataclass(frozen=True, slots=True)
class JobSpan:
    """One job as fairness sees it: team, submitter, when it was present, the most GPUs it could use, its JCT."""

    job_id: str
    team: str
    submitter: str
    arrival: float
    end: float
    most_gpus: int
    jct_s: float | None = None  # None: it did not finish


@dataclass(frozen=True, slots=True)
class Usage:
    """GPU-hours a team or submitter used and was entitled to."""

    name: str
    team: str
    used_gpu_h: float
    entitled_gpu_h: float


@dataclass(frozen=True, slots=True)
class TeamFairness:
    team: str
    nominal_gpus: int
    used_gpu_h: float
    entitled_gpu_h: float
    jobs: int
    finished: int
    max_rho: float | None
    mean_rho: float | None


@dataclass(frozen=True, slots=True)
class JobFairness:
    job_id: str
    team: str
    submitter: str
    jct_s: float | None
    isolated_jct_s: float | None
    rho: float | None


@dataclass(frozen=True, slots=True)
class FairnessReport:
    teams: tuple[TeamFairness, ...]
    submitters: tuple[Usage, ...]
    jobs: tuple[JobFairness, ...]
    jain: float | None
    max_rho: float | None

    def team(self, name: str) -> TeamFairness:
        for t in self.teams:
            if t.team == name:
                return t
        raise KeyError(name)

    def as_dict(self) -> dict[str, object]:
        """JSON-able, rounded: what summary files and MLflow take."""

        def r(x: float | None, n: int = 4) -> float | None:
            return None if x is None else round(x, n)

        return {
            "jain": r(self.jain),
            "max_rho": r(self.max_rho),
            "teams": {
                t.team: {"nominal_gpus": t.nominal_gpus, "used_gpu_h": r(t.used_gpu_h, 3), "entitled_gpu_h": r(t.entitled_gpu_h, 3),
                         "jobs": t.jobs, "finished": t.finished, "max_rho": r(t.max_rho), "mean_rho": r(t.mean_rho)}
                for t in self.teams
            },
            "submitters": {u.name: {"team": u.team, "used_gpu_h": r(u.used_gpu_h, 3), "entitled_gpu_h": r(u.entitled_gpu_h, 3)} for u in self.submitters},
        }  # fmt: skip


def jain_index(values: Sequence[float]) -> float | None:
    """(Σx)² / (n Σx²); None for no values."""
    if not values:
        return None
    square = sum(x * x for x in values)
    return (sum(values) ** 2) / (len(values) * square) if square > 0 else None


def entitled_seconds(spans: Sequence[JobSpan], nominal: Mapping[str, int]) -> tuple[dict[str, float], dict[str, float]]:
    """GPU-seconds each team and each submitter was entitled to (module docstring), by a sweep over arrivals and ends."""
    cuts = sorted({s.arrival for s in spans} | {s.end for s in spans})
    teams: dict[str, float] = {}
    people: dict[str, float] = {}
    for start, stop in zip(cuts, cuts[1:]):
        present = [s for s in spans if s.arrival <= start and s.end >= stop]
        for team in dict.fromkeys(s.team for s in present):
            mine = [s for s in present if s.team == team]
            gpus = min(nominal.get(team, 0), sum(s.most_gpus for s in mine)) * (stop - start)
            teams[team] = teams.get(team, 0.0) + gpus
            who = list(dict.fromkeys(s.submitter for s in mine))
            for person in who:
                people[person] = people.get(person, 0.0) + gpus / len(who)
    return teams, people


def fairness_of(
    spans: Sequence[JobSpan], used_s: Mapping[str, float], nominal: Mapping[str, int], isolated_jct: Mapping[str, float]
) -> FairnessReport:
    """The report from each job's span, GPU-seconds used, the teams' nominal GPUs and each job's isolated JCT."""
    ent_team, ent_person = entitled_seconds(spans, nominal)
    jobs = []
    for s in spans:
        iso = isolated_jct.get(s.job_id)
        rho = s.jct_s / iso if s.jct_s is not None and iso is not None and iso > 0 else None
        jobs.append(JobFairness(s.job_id, s.team, s.submitter, s.jct_s, iso, rho))
    teams = []
    for team in dict.fromkeys([*nominal, *(s.team for s in spans)]):
        mine = [j for j in jobs if j.team == team]
        rhos = [j.rho for j in mine if j.rho is not None]
        used = sum(used_s.get(j.job_id, 0.0) for j in mine)
        teams.append(
            TeamFairness(
                team, nominal.get(team, 0), used / 3600, ent_team.get(team, 0.0) / 3600, len(mine), sum(j.jct_s is not None for j in mine),
                max(rhos) if rhos else None, sum(rhos) / len(rhos) if rhos else None,
            )
        )  # fmt: skip
    people = []
    for person in dict.fromkeys(s.submitter for s in spans):
        team = next(s.team for s in spans if s.submitter == person)
        used = sum(used_s.get(s.job_id, 0.0) for s in spans if s.submitter == person)
        people.append(Usage(person, team, used / 3600, ent_person.get(person, 0.0) / 3600))
    speeds = [sum(1 / j.rho for j in jobs if j.team == t.team and j.rho) / sum(1 for j in jobs if j.team == t.team and j.rho) for t in teams if t.mean_rho is not None]
    all_rho = [j.rho for j in jobs if j.rho is not None]
    return FairnessReport(tuple(teams), tuple(people), tuple(jobs), jain_index(speeds), max(all_rho) if all_rho else None)


Isolate = Callable[[Sequence[JobSpec], int], Mapping[str, float]]
"""Each job's JCT when ``jobs`` (one team's) run alone on that many GPUs."""


def isolated_jcts(jobs: Sequence[JobSpec], teams: TeamTable, capacity: int, isolate: Isolate) -> dict[str, float]:
    """Every job's JCT on its team's nominal share alone (a team with no share, or a job that
    cannot fit it, has none)."""
    nominal = nominal_shares(teams, capacity, teams.names(jobs))
    out: dict[str, float] = {}
    for team, gpus in nominal.items():
        mine = [j for j in jobs if teams.team_of(j) == team]
        if mine and gpus > 0:
            out.update(isolate(mine, gpus))
    return out


def report_run(result: LoopResult, jobs: Sequence[JobSpec], teams: TeamTable, isolate: Isolate) -> FairnessReport:
    """The fairness of a simulated (or any loop's) run of ``jobs`` on ``result.capacity`` GPUs."""
    capacity = result.capacity
    records = {r.job_id: r for r in result.jobs}
    spans = []
    for j in jobs:
        rec = records.get(j.id)
        if rec is None:
            continue
        end = rec.finish if rec.finish is not None else (rec.arrival if rec.dropped else result.end_time)
        spans.append(
            JobSpan(j.id, teams.team_of(j), j.submitter or teams.team_of(j), rec.arrival, end,
                    min(capacity, j.max_gpus if j.elastic else j.requested_gpus), None if rec.finish is None else rec.finish - rec.arrival)
        )  # fmt: skip
    nominal = nominal_shares(teams, capacity, teams.names(jobs))
    return fairness_of(spans, gpu_seconds_by_job(result), nominal, isolated_jcts(jobs, teams, capacity, isolate))


def loop_isolate(run: Callable[[Sequence[JobSpec], int], LoopResult]) -> Isolate:
    """An ``Isolate`` from a function that runs jobs on a GPU count (e.g. the simulator with the inner policy)."""

    def isolate(jobs: Sequence[JobSpec], gpus: int) -> dict[str, float]:
        result = run(jobs, gpus)
        return {r.job_id: r.finish - r.arrival for r in result.jobs if r.finish is not None}

    return isolate
