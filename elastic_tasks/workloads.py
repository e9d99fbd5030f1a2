"""A job's ``workload`` as an entry point: a ``package.module:function`` as given, or a built-in example's name.

Its own module because it knows both sides: the examples build recipes (they import
``elastic_tasks.recipe``), so ``recipe`` itself cannot know the examples without an import circle.
"""

from __future__ import annotations

EXAMPLES_MODULE = "elastic_tasks.examples"
# The built-in examples' names (``elastic_tasks.examples.EXAMPLES``'s keys; a test keeps the two
# equal), spelled out so that resolving a workload does not import the examples, which import
# torch: the service resolves every job's workload and need not load torch for it.
EXAMPLE_NAMES = frozenset(
    {"mlp_tiny", "resnet_small", "alexnet_small", "vgg_small", "resnet_10m", "alexnet_10m", "vgg_10m", "mlp_tiny_adam", "mlp_tiny_adamw"}
)


def resolve_workload(workload: str, job_id: str = "?") -> str:
    """A job's ``workload`` as an entry point: one as given, or a built-in example's name turned into its entry point."""
    if ":" in workload:
        return workload
    if workload in EXAMPLE_NAMES:
        return f"{EXAMPLES_MODULE}:{workload}"
    raise ValueError(
        f"job {job_id!r}.workload={workload!r}: not a training entry point ('package.module:function') "
        f"nor a built-in example ({', '.join(sorted(EXAMPLE_NAMES))})"
    )
