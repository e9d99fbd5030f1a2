"""A simulation's jobs from its files: a jobs file or a trace, with a file of named trajectories."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from allocator.physics.noise import NoiseTrajectory
from allocator.profiles.io import load_profile_dir
from allocator.types import JobSpec, ThroughputProfile
from allocator.workloads.trace import read_trace
from flows.config.jobfile import load_jobs_file, load_noise_file, with_noise
from flows.config.paths import read_text_file


@dataclass(frozen=True, slots=True)
class Workload:
    """The jobs, the GPU count a jobs file gives (None for a trace), and for a trace the profiles it
    took (name -> profile) and their files (name -> path)."""

    jobs: list[JobSpec]
    gpus: int | None = None
    profiles: dict[str, ThroughputProfile] = field(default_factory=dict)
    profile_files: dict[str, Path] = field(default_factory=dict)


def read_workload(path: Path, profiles_dir: Path, envelope: bool = False, noise: Path | None = None) -> Workload:
    """A jobs file (YAML, or JSON mapping) or a trace (CSV, or JSON list).

    A trace's jobs take their profiles from ``profiles_dir``: every ``*.json`` there, named by file
    stem (``category`` N selects ``cat<N>``, seed 000's files). ``noise``: a file of named
    trajectories, given to jobs by id or workload, or named by a trace's ``noise_scale`` cell; a
    job with a different noise scale of its own is refused (two sources for one job)."""
    named = load_noise_file(noise) if noise is not None else {}
    if path.suffix in (".csv", ".json"):
        text = read_text_file(path, "trace" if path.suffix == ".csv" else "workload file")
        if path.suffix == ".csv" or text.lstrip().startswith("["):
            profiles = load_profile_dir(profiles_dir, envelope)
            jobs = read_trace(text, "csv" if path.suffix == ".csv" else "json", profiles, source=str(path), named=named)
            files = {p.stem: p for p in sorted(profiles_dir.glob("*.json"))}
            return Workload(_named_noise(jobs, named, noise), None, profiles, files)
    spec = load_jobs_file(path)
    return Workload(_named_noise(list(spec.jobs), named, noise), spec.gpus)


def _named_noise(jobs: list[JobSpec], named: dict[str, NoiseTrajectory], noise: Path | None) -> list[JobSpec]:
    """Entries keyed by a job id or workload reach those jobs (``with_noise``); every other entry
    must be one a trace row named."""
    if noise is None:
        return jobs
    by_job = {k: v for k, v in named.items() if any(k in (j.id, j.workload) for j in jobs)}
    cited = {k for k in named if k not in by_job and any(j.noise_scale == named[k] for j in jobs)}
    unknown = sorted(set(named) - set(by_job) - cited)
    if unknown:
        raise ValueError(f"--noise[{unknown[0]!r}]: names no job id or workload of this run, and no trace row names it ({noise})")
    return with_noise(jobs, by_job, "--noise")
