"""A simulation's ``summary.json``: its results and everything needed to run it again.

Written by ``malleable simulate`` beside its schedules, read back by ``malleable simulate --rerun``:
the inputs (paths and SHA-256 of the workload file, the profiles a trace used, the noise file),
the settings (GPUs, the loop's settings, the costs charged, how noise scales reach the policy),
the fidelity switches in force in words, each policy variant's parameters as given *and* as in
effect (every default spelled out, so a later change of a default does not change a rerun),
its metrics, its schedule file and that file's SHA-256, and the version that ran it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from importlib import metadata
from pathlib import Path

from allocator.admission import OverflowMode
from allocator.loop import LoopResult, LoopSettings
from allocator.policies import PolicyVariant
from allocator.profiles.measured import TrustSettings
from allocator.simulator import RescaleCost
from flows.config.jobfile import referenced_files
from flows.config.paths import read_text_file

FORMAT = "malleable-simulate-summary/2"
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class SimInputs:
    """What a run read: the workload file (a jobs file or a trace), the profiles directory a trace
    takes its profiles from, whether their envelope was taken, and a noise file."""

    workload: Path
    profiles: Path
    monotone_envelope: bool = False
    noise: Path | None = None
    teams: Path | None = None  # a teams file: the policies run inside the teams' shares (or are only measured)


@dataclass(frozen=True, slots=True)
class SimSettings:
    """How a run simulated: the cluster, the loop, the costs, how jobs report their noise scale."""

    gpus: int
    loop: LoopSettings
    cost: RescaleCost
    report_noise: bool = True
    gpus_per_host: int | None = None  # goodput physics: allreduce across hosts of this many GPUs (None: one flat network)
    fair: bool | None = None  # with teams: each policy inside the teams' shares (True) or alone, the teams measured (False)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def version() -> dict[str, object]:
    """The package version and, from a git checkout, the commit (and whether files differ from it)."""
    out: dict[str, object] = {"malleable": metadata.version("malleable")}
    try:
        head = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(_REPO), "diff", "--quiet", "HEAD", "--"], capture_output=True, timeout=10)
            out |= {"commit": head.stdout.strip(), "dirty": dirty.returncode != 0}
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def jsonable(value: object) -> object:
    """A parameter's value as JSON: an enum by its value, a non-finite number as text (``"inf"``,
    which ``make_policy`` reads back), mappings and sequences item by item."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def fidelity(settings: SimSettings) -> dict[str, object]:
    """The simulator's fidelity switches, as in force for this run (docs/simulator.md)."""
    loop, cost = settings.loop, settings.cost
    return {
        "decisions": "at ticks, arrivals and completions" if loop.react_to_events else "at ticks only",
        "interval_s": loop.interval_s,
        "react_to_noise": loop.react_to_noise,
        "start_cost_s": cost.start_s,
        "rescale": "in-place" if cost.in_place else "restart",
        "change_cost_s": cost.in_place_s if cost.in_place else cost.restart_s,
        "batch_change_cost_s": cost.batch_s,
        "noise": "measured (jobs report their noise scale)" if settings.report_noise else "modelled (the policy's trajectory at declared progress)",
        "network": "one flat network" if settings.gpus_per_host is None else f"hosts of {settings.gpus_per_host} GPUs",
        "teams": "none" if settings.fair is None else "inside the teams' shares" if settings.fair else "measured only",
    }


def _inputs(inputs: SimInputs, trace_profiles: Mapping[str, Path]) -> dict[str, object]:
    out: dict[str, object] = {"workload": {"path": str(inputs.workload.resolve()), "sha256": digest(inputs.workload)}}
    named = {} if trace_profiles else referenced_files(inputs.workload)  # a jobs file's profile and noise files
    if named:
        out["referenced"] = {key: {"path": str(path), "sha256": digest(path)} for key, path in sorted(named.items())}
    if trace_profiles:
        out["profiles"] = {
            "dir": str(inputs.profiles.resolve()),
            "monotone_envelope": inputs.monotone_envelope,
            "files": {name: digest(path) for name, path in sorted(trace_profiles.items())},
        }
    for key, path in (("noise", inputs.noise), ("teams", inputs.teams)):
        if path is not None:
            out[key] = {"path": str(path.resolve()), "sha256": digest(path)}
    return out


def _settings(settings: SimSettings, physics: str) -> dict[str, object]:
    return {
        "gpus": settings.gpus,
        "physics": physics,
        "loop": jsonable(dataclasses.asdict(settings.loop)),
        "cost": jsonable(dataclasses.asdict(settings.cost)),
        "report_noise": settings.report_noise,
        "gpus_per_host": settings.gpus_per_host,
        "fair": settings.fair,
    }


def summary(
    inputs: SimInputs,
    settings: SimSettings,
    physics: str,
    runs: Mapping[str, tuple[PolicyVariant, Mapping[str, object], str, str]],
    trace_profiles: Mapping[str, Path] | None = None,
) -> dict[str, object]:
    """``runs``: label -> (variant, metrics, schedule file name, schedule CSV text)."""
    return {
        "format": FORMAT,
        "version": version(),
        "inputs": _inputs(inputs, trace_profiles or {}),
        "settings": _settings(settings, physics),
        "fidelity": fidelity(settings),
        "policies": {
            label: {
                "policy": variant.name,
                "params": jsonable(dict(variant.params)),
                "effective_params": jsonable(variant.effective()),
                **dict(metrics),
                "schedule": schedule_file,
                "schedule_sha256": text_digest(schedule_text),
            }
            for label, (variant, metrics, schedule_file, schedule_text) in runs.items()
        },
    }


# -- reading one back ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rerun:
    """A summary read back: what to run again, and each variant's recorded schedule digest."""

    inputs: SimInputs
    settings: SimSettings
    variants: tuple[PolicyVariant, ...]
    schedules: dict[str, str]


def _get(data: Mapping[str, object], key: str, where: str) -> object:
    if not isinstance(data, Mapping) or key not in data:
        raise ValueError(f"{where}.{key}: missing")
    return data[key]


def _check(path: str, recorded: str, where: str) -> Path:
    target = Path(path)
    if not target.exists():
        raise ValueError(f"{where}={path!r}: no such file any more")
    if digest(target) != recorded:
        raise ValueError(f"{where}={path!r}: the file changed since the run (its SHA-256 differs from the one recorded)")
    return target


def read_summary(path: Path) -> Rerun:
    """A ``summary.json`` as a run to repeat; ValueError naming the field for anything missing,
    malformed, or an input file that changed since."""
    where = f"summary {str(path)!r}"
    try:
        data = json.loads(read_text_file(path, "summary"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{where}.format={data.get('format') if isinstance(data, dict) else None!r}: not a summary this version can rerun (expected {FORMAT!r})")
    raw_inputs = _get(data, "inputs", where)
    workload = _get(raw_inputs, "workload", f"{where}.inputs")
    profiles = raw_inputs.get("profiles") if isinstance(raw_inputs, dict) else None
    noise = raw_inputs.get("noise") if isinstance(raw_inputs, dict) else None
    teams = raw_inputs.get("teams") if isinstance(raw_inputs, dict) else None
    inputs = SimInputs(
        workload=_check(str(_get(workload, "path", f"{where}.inputs.workload")), str(_get(workload, "sha256", f"{where}.inputs.workload")), "inputs.workload.path"),
        profiles=Path(profiles["dir"]) if profiles else Path("."),
        monotone_envelope=bool(profiles.get("monotone_envelope", False)) if profiles else False,
        noise=_check(str(noise["path"]), str(noise["sha256"]), "inputs.noise.path") if noise else None,
        teams=_check(str(teams["path"]), str(teams["sha256"]), "inputs.teams.path") if teams else None,
    )
    for key, ref in (raw_inputs.get("referenced") or {}).items():  # type: ignore[union-attr]
        _check(str(ref["path"]), str(ref["sha256"]), f"inputs.referenced.{key}.path")
    if profiles:
        for name, recorded in profiles.get("files", {}).items():
            _check(str(inputs.profiles / f"{name}.json"), str(recorded), f"inputs.profiles.files.{name}")
    raw = _get(data, "settings", where)
    try:
        loop = dict(_get(raw, "loop", f"{where}.settings"))  # type: ignore[arg-type]
        trust = loop.pop("trust", None)
        settings = SimSettings(
            gpus=int(_get(raw, "gpus", f"{where}.settings")),  # type: ignore[arg-type]
            loop=LoopSettings(**loop | {"overflow": OverflowMode(loop["overflow"]), "trust": None if trust is None else TrustSettings(**trust)}),
            cost=RescaleCost(**dict(_get(raw, "cost", f"{where}.settings"))),  # type: ignore[arg-type]
            report_noise=bool(raw.get("report_noise", True)),  # type: ignore[union-attr]
            gpus_per_host=raw.get("gpus_per_host"),  # type: ignore[union-attr]
            fair=raw.get("fair"),  # type: ignore[union-attr]
        )
    except (TypeError, KeyError) as exc:
        raise ValueError(f"{where}.settings: malformed ({exc})") from None
    variants, schedules = [], {}
    for label, run in dict(_get(data, "policies", where)).items():  # type: ignore[arg-type]
        at = f"{where}.policies[{label!r}]"
        params = dict(_get(run, "effective_params", at))  # type: ignore[arg-type]
        variants.append(PolicyVariant(str(_get(run, "policy", at)), tuple(params.items()), label))
        schedules[label] = str(_get(run, "schedule_sha256", at))
    return Rerun(inputs, settings, tuple(variants), schedules)


def rerun_summary(path: Path) -> dict[str, LoopResult]:
    """Run a ``summary.json`` again from Python: label -> the loop's result (its schedule is
    ``allocator.metrics.schedule_csv`` of it; compare with ``Rerun.schedules`` via ``text_digest``)."""
    from allocator.fairness.policy import fair
    from allocator.simulator import simulate
    from flows.config.teams_file import load_teams_file
    from flows.simulation.workload import read_workload

    again = read_summary(path)
    inputs, settings = again.inputs, again.settings
    jobs = read_workload(inputs.workload, inputs.profiles, inputs.monotone_envelope, inputs.noise).jobs
    teams = load_teams_file(inputs.teams) if inputs.teams is not None and settings.fair else None
    return {
        v.label: simulate(
            jobs, v.build() if teams is None else fair(v.build(), teams, settings.loop.strict_fifo), settings.gpus, settings.loop, settings.cost,
            gpus_per_host=settings.gpus_per_host, report_noise=settings.report_noise,
        )  # fmt: skip
        for v in again.variants
    }
