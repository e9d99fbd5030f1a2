"""Submissions are jobs-file entries: validated by the jobs file's rules, stored as JSON."""

from __future__ import annotations

import dataclasses
import re

from allocator.physics.noise import noise_to_value
from allocator.profiles.io import profile_to_dict
from allocator.specs import job_from_dict
from allocator.types import JobSpec

_ENTRY = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")
# A sane maximum for one job's work (10^15 samples: years on any cluster); well inside the
# 2^63-1 the store's integer columns hold, so the store never sees an overflow.
MAX_SAMPLES = 10**15


def check_workload(workload: object, where: str = "ENTRYPOINT") -> None:
    """ValueError naming ``where`` unless ``workload`` reads as an entry point or an example name."""
    if not isinstance(workload, str) or not _ENTRY.match(workload):
        raise ValueError(f"{where}={workload!r}: not an entry point ('package.module:function') nor an example name")


def check_samples(spec: JobSpec) -> None:
    if not 1 <= spec.total_samples <= MAX_SAMPLES:
        raise ValueError(f"job {spec.id!r}.samples={spec.total_samples}: must be in [1, {MAX_SAMPLES:.0e}] (a sane maximum; the store holds integers up to 2^63-1)")


def entry_from_spec(spec: JobSpec) -> dict:
    """A JobSpec as a jobs-file entry with its profile inline (what the store keeps)."""
    entry: dict = {
        "id": spec.id,
        "workload": spec.workload,
        "profile": profile_to_dict(spec.profile),
        "samples": spec.total_samples,
        "min_batch": spec.min_batch,
        "max_batch": spec.max_batch,
        "max_gpus": spec.max_gpus,
        "min_gpus": spec.min_gpus,
        "gpus": spec.requested_gpus,
        "elastic": spec.elastic,
        "priority": spec.priority,
    }
    if spec.fixed_batch is not None:
        entry["fixed_batch"] = spec.fixed_batch
    if spec.deadline is not None:
        entry["deadline_s"] = spec.deadline
    if spec.seed is not None:
        entry["seed"] = spec.seed
    if spec.noise_scale is not None and spec.noise_scale != spec.profile.noise_scale:
        entry["noise_scale"] = noise_to_value(spec.noise_scale)
    if spec.base_batch is not None:
        entry["base_batch"] = spec.base_batch
    return entry


def validate_entry(entry: dict) -> JobSpec:
    """The jobs file's rules, plus a workload that can name a recipe; ValueError naming the field."""
    check_workload(entry.get("workload"), f"job {entry.get('id')!r}.workload")
    spec = job_from_dict(entry, 0, {})
    check_samples(spec)
    return spec


def spec_for_loop(entry: dict, job_id: str, arrival: float) -> JobSpec:
    """The stored entry as the loop's JobSpec: the store's id (unique across submitters), arriving now."""
    return dataclasses.replace(job_from_dict(entry, 0, {}), id=job_id, arrival_time=arrival)
