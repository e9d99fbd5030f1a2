"""ThroughputProfile <-> plain dicts (the JSON format of profile files), with field-naming errors.

Format::

    {"workload": "resnet50-cifar100", "hardware": "...", "num_params": 23700000,
     "batch_sizes": [8, 16, 32], "iter_times_s": [0.01, 0.015, 0.026],
     "max_batch_per_gpu": 256,
     "allreduce": {"latency_s": 5e-05, "seconds_per_param": 1.6e-10}}
"""

from __future__ import annotations

from collections.abc import Mapping

from allocator.types import AllreduceModel, ThroughputProfile

_REQUIRED = ("workload", "num_params", "batch_sizes", "iter_times_s", "max_batch_per_gpu")
_KNOWN = frozenset(_REQUIRED + ("hardware", "allreduce"))


def profile_to_dict(profile: ThroughputProfile) -> dict[str, object]:
    return {
        "workload": profile.workload,
        "hardware": profile.hardware,
        "num_params": profile.num_params,
        "batch_sizes": list(profile.batch_sizes),
        "iter_times_s": list(profile.iter_times_s),
        "max_batch_per_gpu": profile.max_batch_per_gpu,
        "allreduce": {"latency_s": profile.allreduce.latency_s, "seconds_per_param": profile.allreduce.seconds_per_param},
    }


def profile_from_dict(data: object, where: str = "profile") -> ThroughputProfile:
    """Build a profile from parsed JSON/YAML; errors say ``where`` and which field is wrong."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"{where}.{missing[0]}: missing required field")
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(_KNOWN))})")
    for key in ("batch_sizes", "iter_times_s"):
        if not isinstance(data[key], (list, tuple)):
            raise ValueError(f"{where}.{key}={data[key]!r}: must be a list")
    comm = data.get("allreduce", {}) or {}
    if not isinstance(comm, Mapping) or set(comm) - {"latency_s", "seconds_per_param"}:
        raise ValueError(f"{where}.allreduce={comm!r}: expected {{latency_s, seconds_per_param}}")
    try:
        return ThroughputProfile(
            workload=data["workload"],
            hardware=str(data.get("hardware", "unknown")),
            num_params=data["num_params"],
            batch_sizes=tuple(data["batch_sizes"]),
            iter_times_s=tuple(data["iter_times_s"]),
            max_batch_per_gpu=data["max_batch_per_gpu"],
            allreduce=AllreduceModel(
                latency_s=comm.get("latency_s", 0.0), seconds_per_param=comm.get("seconds_per_param", 0.0)
            ),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
