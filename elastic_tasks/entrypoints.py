"""A job's ``workload`` -> the training entry point (``package.module:function``) that builds its recipe."""

from __future__ import annotations

EXAMPLES_MODULE = "elastic_tasks.examples"


def resolve_workload(workload: str, job_id: str = "?") -> str:
    """An entry point as given, or a built-in example's name turned into its entry point."""
    from elastic_tasks.examples import EXAMPLES  # torch: only when a job is really resolved

    if ":" in workload:
        return workload
    if workload in EXAMPLES:
        return f"{EXAMPLES_MODULE}:{workload}"
    raise ValueError(
        f"job {job_id!r}.workload={workload!r}: not a training entry point ('package.module:function') "
        f"nor a built-in example ({', '.join(sorted(EXAMPLES))})"
    )
