"""Read a jobs file (YAML or JSON) from disk: parse, resolve profile files, validate.

Profiles may be named in the file's ``profiles:`` mapping as a path (relative to the jobs
file) to a profile JSON, or inline; so may the trajectories of its ``noise_scales:`` mapping
(a path to a JSON/YAML file holding one noise form, or the form inline), which jobs name by
key. Every error is a ValueError naming the file and field.
"""

from __future__ import annotations

from pathlib import Path

import dataclasses
from collections.abc import Mapping, Sequence

from allocator.physics.noise import NoiseTrajectory, noise_from_value
from allocator.profiles.io import profile_from_dict
from allocator.specs import JobsFile, jobs_file_from_dict, noise_scales_from_dict
from allocator.types import JobSpec, ThroughputProfile
from flows.config.paths import read_data_file, read_json_file


def profile_file(base: Path, ref: str, where: str) -> ThroughputProfile:
    """The profile JSON at ``ref`` (relative to ``base``, the naming file's directory)."""
    target = (base / ref).resolve()
    if not target.exists():
        raise ValueError(f"{where}={str(ref)!r}: no such profile file ({target})")
    data = read_json_file(target, f"{where}={str(ref)!r}: profile file")
    return profile_from_dict(data, where)


def _load_profiles(raw: object, base: Path) -> dict[str, ThroughputProfile]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"profiles={raw!r}: must map profile names to files or inline profiles")
    profiles = {}
    for name, ref in raw.items():
        where = f"profiles.{name}"
        profiles[str(name)] = profile_file(base, ref, where) if isinstance(ref, str) else profile_from_dict(ref, where)
    return profiles


def _load_noise_scales(raw: object, base: Path) -> dict[str, NoiseTrajectory]:
    if not isinstance(raw, dict):
        return noise_scales_from_dict(raw)  # None, or refused there with its message
    out: dict[str, object] = {}
    for name, ref in raw.items():
        where = f"noise_scales.{name}"
        if isinstance(ref, str):
            target = (base / ref).resolve()
            if not target.exists():
                raise ValueError(f"{where}={ref!r}: no such noise file ({target})")
            out[str(name)] = noise_from_value(read_data_file(target, f"{where}={ref!r}: noise file"), where)
        else:
            out[str(name)] = ref
    return noise_scales_from_dict(out)


def referenced_files(path: str | Path) -> dict[str, Path]:
    """The files a jobs file names (``profiles.<name>``, ``noise_scales.<name>`` -> path): inputs of a run too."""
    path = Path(path)
    data = read_data_file(path, "jobs file")
    out: dict[str, Path] = {}
    for section in ("profiles", "noise_scales"):
        entries = data.get(section) if isinstance(data, dict) else None
        for name, ref in (entries or {}).items() if isinstance(entries, dict) else ():
            if isinstance(ref, str):
                out[f"{section}.{name}"] = (path.parent / ref).resolve()
    return out


def load_jobs_file(path: str | Path) -> JobsFile:
    path = Path(path)
    data = read_data_file(path, "jobs file")
    if not isinstance(data, dict):
        raise ValueError(f"jobs file {str(path)!r}: expected a mapping with a 'jobs' list")
    profiles = _load_profiles(data.get("profiles"), path.parent)
    return jobs_file_from_dict(data, profiles, _load_noise_scales(data.get("noise_scales"), path.parent))


def load_noise_file(path: str | Path) -> dict[str, NoiseTrajectory]:
    """A JSON/YAML mapping job id or workload -> noise_scale (any form of ``allocator.physics.noise``)."""
    where = f"noise file {str(path)!r}"
    data = read_data_file(Path(path), "noise file")
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{where}: expected a mapping of job ids or workloads to noise scales")
    return {str(key): noise_from_value(value, f"{where}[{str(key)!r}]") for key, value in data.items()}


def with_noise(jobs: Sequence[JobSpec], noise: Mapping[str, NoiseTrajectory], source: str = "noise") -> list[JobSpec]:
    """Jobs take ``noise``'s entry, by job id first, then workload. A key that names no job is
    refused (a typo would otherwise silently change nothing), and so is an entry for a job that
    already has another noise scale (its own, or its profile's): two sources, one job."""
    names = {j.id for j in jobs} | {j.workload for j in jobs}
    unknown = sorted(set(noise) - names)
    if unknown:
        raise ValueError(f"{source}[{unknown[0]!r}]: names no job id or workload of this run")
    out = []
    for job in jobs:
        key = job.id if job.id in noise else job.workload if job.workload in noise else None
        if key is None:
            out.append(job)
            continue
        if job.noise_scale is not None and job.noise_scale != noise[key]:
            own = "its own noise_scale" if job.noise_scale != job.profile.noise_scale else f"its profile's noise_scale ({job.profile.workload})"
            raise ValueError(f"{source}[{key!r}]: job {job.id!r} already has {own}, a different one; give each job's noise scale in one place")
        out.append(dataclasses.replace(job, noise_scale=noise[key]))
    return out
