"""The public Python API: the names here stay importable across releases (docs/api.md).

A name that moves inside the implementation stays here; a name that is ever withdrawn first
answers with a DeprecationWarning for at least one release (``tests/test_public_api.py`` pins
the list). Everything is pure Python over the allocator layer, plus reading jobs files and
simulation summaries: importing this module starts no framework (no torch, Dask, Prefect or MLflow).

    from malleable.api import load_jobs_file, parse_policy, simulate, RescaleCost, LoopSettings, summarise

    jobs = load_jobs_file("jobs.yaml").jobs
    result = simulate(jobs, parse_policy("goodput_dp:p=-1").build(), 64, LoopSettings(interval_s=60, react_to_events=False),
                      RescaleCost(in_place_s=30, start_s=30))
    print(summarise(result, {j.id: j for j in jobs}).avg_jct_s)
"""

from __future__ import annotations

from allocator.loop import JobRecord, LoopResult, LoopSettings, ScheduleRow, run_loop
from allocator.metrics import RunMetrics, read_schedule_csv, schedule_csv, summarise
from allocator.physics.choice import Physics, physics_of
from allocator.physics.noise import NoiseTrajectory, noise_from_value
from allocator.policies import (
    Policy,
    PolicyVariant,
    UnknownPolicyError,
    available_policies,
    effective_parameters,
    make_policy,
    parse_policy,
    policy_defaults,
    policy_parameters,
)
from allocator.simulator import RescaleCost, simulate
from allocator.specs import JobsFile, jobs_file_from_dict, spec_from_dict, spec_to_dict
from allocator.types import Allocation, ClusterSnapshot, InfeasibleError, JobSpec, RunningJob, Share, SizeKnowledge, ThroughputProfile
from allocator.workloads.trace import read_trace, write_trace
from flows.config.jobfile import load_jobs_file
from flows.simulation.provenance import Rerun, read_summary, rerun_summary
from flows.simulation.workload import Workload, read_workload

__all__ = [
    # jobs and what policies see
    "Allocation", "ClusterSnapshot", "InfeasibleError", "JobSpec", "NoiseTrajectory", "RunningJob", "Share", "SizeKnowledge", "ThroughputProfile",
    # reading and writing workloads
    "JobsFile", "Workload", "jobs_file_from_dict", "load_jobs_file", "noise_from_value", "read_trace", "read_workload", "spec_from_dict",
    "spec_to_dict", "write_trace",
    # policies
    "Policy", "PolicyVariant", "UnknownPolicyError", "available_policies", "effective_parameters", "make_policy", "parse_policy",
    "policy_defaults", "policy_parameters",
    # simulating and measuring
    "JobRecord", "LoopResult", "LoopSettings", "Physics", "RescaleCost", "RunMetrics", "ScheduleRow", "physics_of", "read_schedule_csv",
    "run_loop", "schedule_csv", "simulate", "summarise",
    # summaries of `malleable simulate`
    "Rerun", "read_summary", "rerun_summary",
]  # fmt: skip
