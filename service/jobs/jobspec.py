"""A submitted job: the checks a submission passes.

A job is parsed once, where it enters (the CLI's flags, a jobs file, the client's entry
mapping), into a ``JobSpec``; from there on it travels whole. What the store keeps of it, and
how an older row is read back: ``service.jobs.stored``.
"""

from __future__ import annotations

import re

from allocator.specs import job_from_dict
from allocator.types import JobSpec
from elastic_tasks.workloads import resolve_workload
from service.jobs.limits import MAX_SAMPLES, MAX_WORKLOAD, check_limits, quoted, shown_value

__all__ = ["MAX_SAMPLES", "check_samples", "check_submission", "check_workload", "spec_from_entry"]

_ENTRY = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")


def check_workload(workload: object, where: str = "ENTRYPOINT") -> None:
    """ValueError naming ``where`` unless ``workload`` reads as an entry point or an example name."""
    if not isinstance(workload, str) or len(workload) > MAX_WORKLOAD or not _ENTRY.match(workload):
        raise ValueError(f"{where}={quoted(workload)}: not an entry point ('package.module:function') nor an example name")


def check_samples(spec: JobSpec) -> None:
    if not 1 <= spec.total_samples <= MAX_SAMPLES:
        raise ValueError(f"job {quoted(spec.id)}.samples={spec.total_samples}: must be in [1, {MAX_SAMPLES:.0e}] (a sane maximum; the store holds integers up to 2^63-1)")


def check_submission(spec: JobSpec) -> JobSpec:
    """What a JobSpec must be beyond its own rules to be submitted — the one validator of
    ``submit`` (flags and files), the Python client and the service's feed: every field within
    its limit (``service.jobs.limits``), a workload that names a recipe (an entry point's form,
    or a built-in example: a profile's name is not one). ``spec`` itself, or ValueError naming the field."""
    check_samples(spec)
    check_limits(spec)
    where = f"job {quoted(spec.id)}.workload"
    check_workload(spec.workload, where)
    resolve_workload(spec.workload, shown_value(spec.id))
    return spec


def spec_from_entry(entry: object) -> JobSpec:
    """A jobs-file entry (the Python client's input, its profile inline) parsed into the JobSpec
    that is submitted; ValueError naming the field."""
    if isinstance(entry, dict):  # the workload first: its message is the clearer one
        check_workload(entry.get("workload"), f"job {entry.get('id')!r}.workload")
    return check_submission(job_from_dict(entry, 0, {}))
