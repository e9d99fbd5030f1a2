"""A job's ``workload`` as an entry point: a ``package.module:function`` as given, or a built-in example's name.

Its own module because it knows both sides: the examples build recipes (they import
``elastic_tasks.recipe``), so ``recipe`` itself cannot know the examples without an import circle.
"""

from __future__ import annotations

from elastic_tasks.examples import EXAMPLES

EXAMPLES_MODULE = "elastic_tasks.examples"


def resolve_workload(workload: str, job_id: str = "?") -> str:
    """A job's ``workload`` as an entry point: one as given, or a built-in example's name turned into its entry point."""
    if ":" in workload:
        return workload
    if workload in EXAMPLES:
        return f"{EXAMPLES_MODULE}:{workload}"
    raise ValueError(
        f"job {job_id!r}.workload={workload!r}: not a training entry point ('package.module:function') "
        f"nor a built-in example ({', '.join(sorted(EXAMPLES))})"
    )
