"""The ``quickstart`` flow: the README's main job, end to end on one machine.

Profile the example model here (cached: the second run skips it), write a jobs file of three
small jobs arriving at different times with that profile, and run it through the ``cluster``
flow on a LocalCluster of virtual GPU workers under ``elastic_dp`` — real gloo training that
grows and shrinks in place, recorded in MLflow and Prefect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from prefect import flow

from allocator.loop import StepReport
from allocator.profiles.io import profile_to_dict
from flows.cluster_flow import ClusterOutcome, cluster_flow
from flows.profile_flow import profile_flow
from flows.config.settings import load_settings

MODEL = "alexnet_small"


@dataclass(frozen=True, slots=True)
class QuickJob:
    id: str
    samples: int
    arrival_s: float


# Job a starts alone and gets the whole cluster; b and c arrive and take GPUs from it in place;
# when a job finishes, the others grow into what it frees.
JOBS = (QuickJob("job-a", 32768, 0.0), QuickJob("job-b", 16384, 5.0), QuickJob("job-c", 16384, 10.0))


def quickstart_jobs_file(path: Path, profile: dict, workers: int, scale: float, model: str) -> Path:
    data = {
        "gpus": workers,
        "policy": "elastic_dp",
        "profiles": {model: profile},
        "jobs": [
            {
                "id": j.id,
                "workload": model,
                "profile": model,
                "samples": max(256, int(j.samples * scale)),
                "min_batch": 32,
                "max_batch": 256,
                "max_gpus": workers,
                "arrival_s": j.arrival_s * min(1.0, max(scale, 0.25)),
            }
            for j in JOBS
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by `malleable quickstart` with profiles measured on this machine.\n" + yaml.safe_dump(data, sort_keys=False))
    return path


@flow(name="quickstart", log_prints=True)
def quickstart_flow(
    workers: int = 4, scale: float = 1.0, interval_s: float = 5.0, model: str = MODEL, on_step: Callable[[StepReport], None] | None = None
) -> ClusterOutcome:
    """Three jobs, ``workers`` virtual GPUs, elastic_dp; ``scale`` shrinks the work (tests); ``on_step`` sees every decision."""
    if not (scale > 0):
        raise ValueError(f"scale={scale!r}: must be > 0")
    settings = load_settings(workers=workers, interval_s=interval_s)
    profile = profile_flow(f"elastic_tasks.examples:{model}", batch_sizes=[16, 32, 64], repeats=3, warmup=1)
    jobs_file = quickstart_jobs_file(settings.state_dir / "quickstart" / "jobs.yaml", profile_to_dict(profile), workers, scale, model)
    print(f"jobs file written to {jobs_file}")
    return cluster_flow(str(jobs_file), workers=workers, policy="elastic_dp", interval_s=interval_s, run_name="quickstart", on_step=on_step, to_running_service=False)
