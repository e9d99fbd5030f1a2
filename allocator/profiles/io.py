"""ThroughputProfile <-> plain dicts (the JSON format of profile files), with field-naming errors.

Format::

    {"workload": "resnet50-cifar100", "hardware": "...", "num_params": 23700000,
     "batch_sizes": [8, 16, 32], "iter_times_s": [0.01, 0.015, 0.026],
     "max_batch_per_gpu": 256,
     "allreduce": {"latency_s": 5e-05, "seconds_per_param": 1.6e-10},
     "inter_host": {"latency_s": 2e-04, "seconds_per_param": 8e-10},
     "noise_scale": {"fractions": [0, 0.5], "values": [150, 420]}}

``inter_host`` (optional) is the allreduce fit across hosts (``allreduce`` then holds the
intra-host one); ``noise_scale`` (optional) the gradient noise scale in any form of
``allocator.physics.noise`` — jobs using the profile take it unless they give their own;
``overlap`` (optional, γ >= 1, default 1) how far the allreduce hides behind the backward pass
(``allocator.physics.throughput.last_micro_step``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from allocator.physics.noise import noise_from_value, noise_to_value
from allocator.strict import check_fields, mapping
from allocator.types import AllreduceModel, ThroughputProfile

_REQUIRED = ("workload", "num_params", "batch_sizes", "iter_times_s", "max_batch_per_gpu")
_KNOWN = frozenset(_REQUIRED + ("hardware", "allreduce", "inter_host", "noise_scale", "overlap"))


def _ring(model: AllreduceModel) -> dict[str, float]:
    return {"latency_s": model.latency_s, "seconds_per_param": model.seconds_per_param}


def profile_to_dict(profile: ThroughputProfile) -> dict[str, object]:
    out: dict[str, object] = {
        "workload": profile.workload,
        "hardware": profile.hardware,
        "num_params": profile.num_params,
        "batch_sizes": list(profile.batch_sizes),
        "iter_times_s": list(profile.iter_times_s),
        "max_batch_per_gpu": profile.max_batch_per_gpu,
        "allreduce": _ring(profile.allreduce),
    }
    if profile.inter_host is not None:
        out["inter_host"] = _ring(profile.inter_host)
    if profile.noise_scale is not None:
        out["noise_scale"] = noise_to_value(profile.noise_scale)
    if profile.overlap != 1.0:
        out["overlap"] = profile.overlap
    return out


def _ring_from(value: object, where: str) -> AllreduceModel:
    comm = value or {}
    if not isinstance(comm, Mapping) or set(comm) - {"latency_s", "seconds_per_param"}:
        raise ValueError(f"{where}={comm!r}: expected {{latency_s, seconds_per_param}}")
    try:
        return AllreduceModel(latency_s=comm.get("latency_s", 0.0), seconds_per_param=comm.get("seconds_per_param", 0.0))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def monotone_envelope(times: tuple[float, ...]) -> tuple[float, ...]:
    """The smallest non-decreasing sequence at or above ``times`` (running maximum): a point
    measured faster than a smaller batch before it (noise, a few per cent) is raised to that
    batch's time. Raising, never lowering, keeps the model from promising speed nobody measured."""
    out, top = [], float("-inf")
    for t in times:
        top = max(top, t)
        out.append(top)
    return tuple(out)


def profile_from_dict(data: object, where: str = "profile", envelope: bool = False) -> ThroughputProfile:
    """Build a profile from parsed JSON/YAML; errors say ``where`` and which field is wrong.
    ``envelope``: replace non-monotone iteration times by their ``monotone_envelope``."""
    data = mapping(data, where)
    check_fields(data, _KNOWN, where, _REQUIRED)
    for key in ("batch_sizes", "iter_times_s"):
        if not isinstance(data[key], (list, tuple)):
            raise ValueError(f"{where}.{key}={data[key]!r}: must be a list")
    allreduce = _ring_from(data.get("allreduce"), f"{where}.allreduce")
    inter = None if data.get("inter_host") is None else _ring_from(data["inter_host"], f"{where}.inter_host")
    noise = noise_from_value(data["noise_scale"], f"{where}.noise_scale") if data.get("noise_scale") is not None else None
    try:
        return ThroughputProfile(
            workload=data["workload"],
            hardware=str(data.get("hardware", "unknown")),
            num_params=data["num_params"],
            batch_sizes=tuple(data["batch_sizes"]),
            iter_times_s=monotone_envelope(tuple(data["iter_times_s"])) if envelope else tuple(data["iter_times_s"]),
            max_batch_per_gpu=data["max_batch_per_gpu"],
            allreduce=allreduce,
            inter_host=inter,
            noise_scale=noise,
            overlap=data.get("overlap", 1.0),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_profile_dir(directory: str | Path, envelope: bool = False) -> dict[str, ThroughputProfile]:
    """Every ``*.json`` profile in ``directory``, by file stem; seed 000's ``seed000_cat<N>``
    files also as ``cat<N>`` (what a trace's ``category`` column selects). Errors name the file."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"profiles={str(root)!r}: not a directory")
    found: dict[str, ThroughputProfile] = {}
    for path in sorted(root.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"profile file {str(path)!r}: not readable JSON ({exc})") from None
        profile = profile_from_dict(data, f"profile file {str(path)!r}", envelope)
        found[path.stem] = profile
        if path.stem.startswith("seed000_cat"):
            found[path.stem.removeprefix("seed000_")] = profile
    if not found:
        raise ValueError(f"profiles={str(root)!r}: no *.json profile files there")
    return found
