"""Jobs-file entries (parsed YAML/JSON dicts) -> JobSpecs, with errors naming the job and field.

A job entry::

    id: resnet-1            # required, unique
    profile: resnet50       # a name from the file's ``profiles:`` or an inline profile mapping
    samples: 2000000        # work in samples (or ``epochs`` + ``dataset_samples``)
    min_batch: 32           # global batch range
    max_batch: 256
    max_gpus: 8
    # optional: workload, min_gpus, gpus (requested, for non-elastic/fixed), elastic,
    #           arrival_s, fixed_batch, priority, deadline_s, seed,
    #           noise_scale (any form of ``allocator.physics.noise``, or the name of one of the
    #           file's ``noise_scales:``), base_batch (B0),
    #           team, submitter (allocator.fairness.teams), priority as a class name
    #           (best-effort, default, nightly: allocator.fairness.priority) or an integer,
    #           size (exact | estimate | unknown: how far ``samples`` can be trusted),
    #           actual_samples (simulations only: the work the job really does)

Trajectories shared by many jobs are written once, under the file's ``noise_scales:`` (name ->
any noise form; ``flows.config.jobfile`` also reads a path there), and named by each job.

File reading and path resolution live in ``flows.config.jobfile``; this module only validates.

A jobs-file entry is what a *person* writes (``samples`` or ``epochs``, a named profile, ``_s``
suffixes). Once parsed, a job travels as one record, the ``JobSpec``; where it has to cross a
process or a database it is written as ``spec_to_dict`` — one key per JobSpec field, under the
field's own name, the profile inline — and read back with ``spec_from_dict``, which gives the
same JobSpec field for field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocator.fairness.priority import priority_value
from allocator.physics.noise import NoiseTrajectory, noise_from_value, noise_to_value
from allocator.profiles.io import profile_from_dict, profile_to_dict
from allocator.strict import check_fields
from allocator.types import JobSpec, SizeKnowledge, ThroughputProfile

_JOB_FIELDS = frozenset(
    {
        "id",
        "workload",
        "profile",
        "samples",
        "epochs",
        "dataset_samples",
        "min_batch",
        "max_batch",
        "max_gpus",
        "min_gpus",
        "gpus",
        "elastic",
        "arrival_s",
        "fixed_batch",
        "priority",
        "deadline_s",
        "seed",
        "noise_scale",
        "base_batch",
        "team",
        "submitter",
        "size",
        "actual_samples",
    }
)
_REQUIRED = ("id", "profile", "min_batch", "max_batch", "max_gpus")


@dataclass(frozen=True, slots=True)
class JobsFile:
    """What a jobs file holds: the jobs, and optional defaults for the GPU count and policy."""

    jobs: tuple[JobSpec, ...]
    gpus: int | None = None
    policy: str | None = None


def _label(entry: Mapping[str, object], index: int) -> str:
    name = entry.get("id")
    return f"job {name!r} (jobs[{index}])" if isinstance(name, str) and name else f"jobs[{index}]"


def _samples(entry: Mapping[str, object], label: str) -> object:
    if "samples" in entry:
        return entry["samples"]
    if "epochs" in entry and "dataset_samples" in entry:
        epochs, size = entry["epochs"], entry["dataset_samples"]
        if not isinstance(epochs, (int, float)) or not isinstance(size, int) or epochs <= 0 or size <= 0:
            raise ValueError(f"{label}.epochs={epochs!r}, dataset_samples={size!r}: must be positive numbers")
        return int(round(epochs * size))
    raise ValueError(f"{label}.samples: missing required field (or give epochs and dataset_samples)")


def _noise_of(value: object, label: str, named: Mapping[str, NoiseTrajectory]) -> NoiseTrajectory | None:
    """A job's ``noise_scale``: any noise form, or the name of one of the file's ``noise_scales``."""
    if value is None:
        return None
    if isinstance(value, str) and named:
        if value not in named:
            known = ", ".join(sorted(named)) or "none"
            raise ValueError(f"{label}.noise_scale={value!r}: no such entry in the file's noise_scales (known: {known})")
        return named[value]
    return noise_from_value(value, f"{label}.noise_scale")


def job_from_dict(entry: object, index: int, profiles: Mapping[str, ThroughputProfile], noise_scales: Mapping[str, NoiseTrajectory] | None = None) -> JobSpec:
    if not isinstance(entry, Mapping):
        raise ValueError(f"jobs[{index}]: expected a mapping, got {type(entry).__name__}")
    label = _label(entry, index)
    check_fields(entry, _JOB_FIELDS, label, _REQUIRED)
    ref = entry["profile"]
    if isinstance(ref, str):
        if ref not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise ValueError(f"{label}.profile={ref!r}: no such profile (known: {known})")
        profile = profiles[ref]
    else:
        profile = profile_from_dict(ref, f"{label}.profile")
    gpus = entry.get("gpus")
    noise_scale = _noise_of(entry.get("noise_scale"), label, noise_scales or {})
    try:
        return JobSpec(
            id=entry["id"],
            workload=entry.get("workload", profile.workload),
            total_samples=_samples(entry, label),
            min_batch=entry["min_batch"],
            max_batch=entry["max_batch"],
            max_gpus=entry["max_gpus"],
            min_gpus=entry.get("min_gpus", 1),
            requested_gpus=gpus,
            profile=profile,
            elastic=entry.get("elastic", True),
            arrival_time=entry.get("arrival_s", 0.0),
            fixed_batch=entry.get("fixed_batch"),
            priority=priority_value(entry.get("priority", 0), f"{label}.priority"),
            deadline=entry.get("deadline_s"),
            seed=entry.get("seed"),
            noise_scale=noise_scale,
            base_batch=entry.get("base_batch"),
            team=entry.get("team"),
            submitter=entry.get("submitter"),
            size=entry.get("size", SizeKnowledge.EXACT),
            actual_samples=entry.get("actual_samples"),
        )
    except ValueError as exc:
        # JobSpec names the job and field already; add the position in the file.
        raise ValueError(f"{exc} (jobs[{index}])") from None
    except TypeError as exc:
        raise ValueError(f"{label}: {exc}") from None


def noise_scales_from_dict(raw: object) -> dict[str, NoiseTrajectory]:
    """A jobs file's ``noise_scales:``: name -> any noise form (a path is ``flows.config``'s to read)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"jobs file.noise_scales={raw!r}: must map names to noise scales")
    return {str(name): value if isinstance(value, NoiseTrajectory) else noise_from_value(value, f"noise_scales.{name}") for name, value in raw.items()}


def jobs_file_from_dict(data: object, profiles: Mapping[str, ThroughputProfile], noise_scales: Mapping[str, NoiseTrajectory] | None = None) -> JobsFile:
    """Validate a whole parsed jobs file. ``profiles`` are the named profiles already loaded;
    ``noise_scales`` the named trajectories, if already loaded (else the file's own, read here)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"jobs file: expected a mapping with a 'jobs' list, got {type(data).__name__}")
    check_fields(data, ("jobs", "gpus", "policy", "profiles", "noise_scales"), "jobs file", kind="top-level field")
    entries = data.get("jobs")
    if not isinstance(entries, Sequence) or isinstance(entries, (str, bytes)) or not entries:
        raise ValueError(f"jobs file.jobs={entries!r}: must be a non-empty list of jobs")
    named = noise_scales if noise_scales is not None else noise_scales_from_dict(data.get("noise_scales"))
    jobs = tuple(job_from_dict(e, i, profiles, named) for i, e in enumerate(entries))
    seen: set[str] = set()
    for i, job in enumerate(jobs):
        if job.id in seen:
            raise ValueError(f"job {job.id!r} (jobs[{i}]).id: duplicate job id")
        seen.add(job.id)
    gpus = data.get("gpus")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus <= 0):
        raise ValueError(f"jobs file.gpus={gpus!r}: must be a positive integer")
    policy = data.get("policy")
    if policy is not None and not isinstance(policy, str):
        raise ValueError(f"jobs file.policy={policy!r}: must be a policy name")
    return JobsFile(jobs=jobs, gpus=gpus, policy=policy)


# -- the record's own serialisation --------------------------------------------------------

# Every JobSpec field, under its own name (and nothing else).
SPEC_FIELDS = (
    "id", "workload", "total_samples", "min_batch", "max_batch", "max_gpus", "profile", "elastic", "arrival_time",
    "min_gpus", "requested_gpus", "fixed_batch", "priority", "deadline", "seed", "noise_scale", "base_batch",
    "team", "submitter", "size", "actual_samples",
)  # fmt: skip
_SPEC_REQUIRED = ("id", "workload", "total_samples", "min_batch", "max_batch", "max_gpus", "profile")


def spec_to_dict(spec: JobSpec) -> dict[str, object]:
    """``spec`` as plain JSON-able data: one key per field under the field's name, the profile inline.

    Fields left at ``None`` are left out (their default), as is a noise scale that is the
    profile's own (JobSpec takes the profile's when given none): the same JobSpec comes back."""
    out: dict[str, object] = {name: getattr(spec, name) for name in SPEC_FIELDS if getattr(spec, name) is not None}
    out["profile"] = profile_to_dict(spec.profile)
    if spec.noise_scale is None or spec.noise_scale == spec.profile.noise_scale:
        out.pop("noise_scale", None)
    else:
        out["noise_scale"] = noise_to_value(spec.noise_scale)
    if spec.size is SizeKnowledge.EXACT:
        out.pop("size")  # the default: records written before the field read back the same
    else:
        out["size"] = spec.size.value
    return out


def spec_from_dict(data: object, where: str = "job") -> JobSpec:
    """The JobSpec ``spec_to_dict`` wrote; ValueError naming ``where`` and the field otherwise."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    name = data.get("id")
    label = f"job {name!r}" if isinstance(name, str) and name else where
    check_fields(data, SPEC_FIELDS, label, _SPEC_REQUIRED)
    fields = dict(data)
    fields["profile"] = profile_from_dict(data["profile"], f"{label}.profile")
    if data.get("noise_scale") is not None:
        fields["noise_scale"] = noise_from_value(data["noise_scale"], f"{label}.noise_scale")
    try:
        return JobSpec(**fields)
    except TypeError as exc:
        raise ValueError(f"{label}: {exc}") from None
