"""A job submitted without a profile: the newest cached measurement of its workload, else a neutral prior."""

from __future__ import annotations

import json
from pathlib import Path

from allocator.profiles.io import profile_from_dict, profile_to_dict
from allocator.types import AllreduceModel, ThroughputProfile


def cached_profile(directory: Path, workload: str) -> ThroughputProfile | None:
    """The newest profile in ``directory`` (a profile cache) measured for ``workload``."""
    best: tuple[float, ThroughputProfile] | None = None
    for path in Path(directory).glob("*.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            profile = profile_from_dict(data.get("profile"), str(path))
        except (OSError, ValueError, AttributeError):
            continue
        if profile.workload in (workload, workload.rsplit(":", 1)[-1]):
            mtime = path.stat().st_mtime
            if best is None or mtime > best[0]:
                best = (mtime, profile)
    return None if best is None else best[1]


def prior_profile(workload: str) -> ThroughputProfile:
    """Step time linear in the per-GPU batch with a fixed overhead, and a cheap allreduce: the
    policy sees near-linear scaling until the overhead matters. A placeholder until measured."""
    sizes = (1, 8, 64, 256)
    return ThroughputProfile(
        workload=workload.rsplit(":", 1)[-1],
        hardware="prior",
        num_params=1_000_000,
        batch_sizes=sizes,
        iter_times_s=tuple(0.005 + 0.0005 * b for b in sizes),
        max_batch_per_gpu=256,
        allreduce=AllreduceModel(latency_s=0.001, seconds_per_param=1e-9),
    )


def with_profile(entry: object, cache_dir: Path | None) -> tuple[object, str | None]:
    """A jobs-file entry given without a ``profile``, completed as ``malleable submit`` completes it:
    the newest profile cached for its workload in ``cache_dir``, else a neutral prior (and a note
    saying so). Anything else is returned as it is, for validation to name what is wrong."""
    if not isinstance(entry, dict) or "profile" in entry or not isinstance(entry.get("workload"), str) or not entry["workload"]:
        return entry, None
    workload = entry["workload"]
    found = cached_profile(cache_dir, workload) if cache_dir is not None else None
    if found is not None:
        return {**entry, "profile": profile_to_dict(found)}, None
    note = f"no measured profile for {workload!r}: the policy plans with a neutral prior (run `malleable profile {workload}` for a measured one)"
    return {**entry, "profile": profile_to_dict(prior_profile(workload))}, note
