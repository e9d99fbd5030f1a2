"""Teams: who shares the cluster, and what each is entitled to.

A team has a nominal GPU quota (Kueue's ``nominalQuota``) or a weight (its part of the GPUs no
quota names), and members: submitter names or fnmatch patterns. A submitter no team lists
belongs to the default team. A teams file (YAML or JSON, read by the service and ``simulate``)::

    default_team: default          # optional: where unlisted submitters go (default "default")
    teams:
      research:
        quota: 48                  # GPUs it is guaranteed while it has work for them
        members: [alice, bob, "retrain:*"]
      product:
        weight: 1                  # or a weight: its part of the GPUs left after quotas
        members: [carol]

A job's team is its ``JobSpec.team`` when set (jobs files and traces of a simulation), else its
submitter's. The service sets every job's team from its own table (a submitter cannot pick one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from allocator.strict import check_fields, mapping
from allocator.types import JobSpec

DEFAULT_TEAM = "default"


@dataclass(frozen=True, slots=True)
class Team:
    """``quota``: nominal GPUs (None: a share of what quotas leave, by ``weight``). ``weight`` also
    splits GPUs lent from idle quota among teams that borrow (per weight, max-min)."""

    name: str
    quota: int | None = None
    weight: float = 1.0
    members: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        owner = f"team {self.name!r}" if isinstance(self.name, str) and self.name else "team"
        if not (isinstance(self.name, str) and self.name.strip()):
            raise ValueError(f"{owner}.name={self.name!r}: must be a non-empty string")
        if self.quota is not None and not (isinstance(self.quota, int) and not isinstance(self.quota, bool) and self.quota >= 0):
            raise ValueError(f"{owner}.quota={self.quota!r}: must be an integer number of GPUs >= 0")
        if not (isinstance(self.weight, (int, float)) and not isinstance(self.weight, bool) and math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"{owner}.weight={self.weight!r}: must be a finite number > 0")
        object.__setattr__(self, "members", tuple(self.members))
        for m in self.members:
            if not (isinstance(m, str) and m.strip()):
                raise ValueError(f"{owner}.members: {m!r} must be a non-empty submitter name or pattern")

    def has(self, submitter: str) -> bool:
        """``submitter`` is listed: by name or pattern, whole (``alice@host``) or its user part (``alice``)."""
        user = submitter.split("@", 1)[0]
        return any(fnmatchcase(submitter, m) or fnmatchcase(user, m) for m in self.members)


@dataclass(frozen=True, slots=True)
class TeamTable:
    """The teams of one cluster, in the order given (the first team listing a submitter has it)."""

    teams: tuple[Team, ...] = ()
    default: str = DEFAULT_TEAM

    def __post_init__(self) -> None:
        object.__setattr__(self, "teams", tuple(self.teams))
        seen: set[str] = set()
        for team in self.teams:
            if not isinstance(team, Team):
                raise ValueError(f"TeamTable.teams: {team!r} must be a Team")
            if team.name in seen:
                raise ValueError(f"team {team.name!r}: listed twice")
            seen.add(team.name)
        if not (isinstance(self.default, str) and self.default.strip()):
            raise ValueError(f"TeamTable.default={self.default!r}: must be a team name")

    def team(self, name: str) -> Team:
        """The configured team, or one with no quota and weight 1 (a team only jobs name)."""
        for team in self.teams:
            if team.name == name:
                return team
        return Team(name)

    def team_of_submitter(self, submitter: str | None) -> str:
        if submitter:
            for team in self.teams:
                if team.has(submitter):
                    return team.name
        return self.default

    def team_of(self, job: JobSpec) -> str:
        return job.team if job.team else self.team_of_submitter(job.submitter)

    def names(self, jobs: Sequence[JobSpec] = ()) -> tuple[str, ...]:
        """Every team that shares the cluster now: the configured ones, the default, and any a job names."""
        out = [t.name for t in self.teams]
        for name in [self.default, *(self.team_of(j) for j in jobs)]:
            if name not in out:
                out.append(name)
        return tuple(out)


def teams_from_dict(data: object, where: str = "teams file") -> TeamTable:
    """A parsed teams file -> TeamTable; ValueError naming the file, team and field."""
    top = mapping(data, where)
    check_fields(top, ("teams", "default_team"), where, ("teams",), kind="top-level field")
    entries = mapping(top["teams"], f"{where}.teams")
    if not entries:
        raise ValueError(f"{where}.teams: must name at least one team")
    teams = []
    for name, raw in entries.items():
        label = f"{where}.teams.{name}"
        body = mapping({} if raw is None else raw, label)
        check_fields(body, ("quota", "weight", "members"), label)
        members = body.get("members", ())
        if isinstance(members, str) or not isinstance(members, Sequence):
            raise ValueError(f"{label}.members={members!r}: must be a list of submitter names or patterns")
        try:
            teams.append(Team(str(name), quota=body.get("quota"), weight=body.get("weight", 1.0), members=tuple(members)))  # type: ignore[arg-type]
        except ValueError as exc:  # named as the file names it: teams file.teams.<name>.<field>
            raise ValueError(str(exc).replace(f"team {str(name)!r}", label, 1)) from None
    default = top.get("default_team", DEFAULT_TEAM)
    try:
        return TeamTable(tuple(teams), default=default)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def teams_to_dict(table: TeamTable) -> dict[str, object]:
    """The table as a teams file says it (``teams_from_dict`` gives it back)."""
    teams: dict[str, Mapping[str, object]] = {}
    for t in table.teams:
        body: dict[str, object] = {"weight": t.weight}
        if t.quota is not None:
            body["quota"] = t.quota
        if t.members:
            body["members"] = list(t.members)
        teams[t.name] = body
    return {"default_team": table.default, "teams": teams}
