"""A job submitted without a profile: the newest cached measurement of its workload, else a neutral prior."""

from __future__ import annotations

import json
from pathlib import Path

from allocator.profile_io import profile_from_dict
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
