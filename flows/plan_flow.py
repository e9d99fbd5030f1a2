"""The ``plan`` flow: what a policy gives each job of a jobs file on N GPUs, as a Prefect table."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from allocator.plan import Plan, make_plan
from allocator.policies import parse_policy
from allocator.types import JobSpec
from flows.recording.artifacts import artifact_key
from flows.config.jobfile import load_jobs_file
from prefect.artifacts import create_table_artifact


def publish_plan(plan: Plan) -> None:
    create_table_artifact(
        key=artifact_key("plan", plan.policy),
        table=[
            {
                "job": j.job_id,
                "gpus": j.share.gpus if j.share else 0,
                "batch": j.share.global_batch if j.share else 0,
                "samples_per_s": f"{j.samples_per_s:.0f}",
                "predicted_runtime_s": "-" if j.predicted_runtime_s is None else f"{j.predicted_runtime_s:.0f}",
            }
            for j in plan.jobs
        ]
        + [{"job": w, "gpus": 0, "batch": 0, "samples_per_s": "-", "predicted_runtime_s": "queued"} for w in plan.waiting],
        description=f"{plan.policy} on {plan.capacity} GPUs ({plan.gpus_used} used)",
    )


@flow(name="plan")
def plan_jobs(jobs: list[JobSpec], gpus: int, policy: str = "elastic_dp") -> Plan:
    plan = make_plan(jobs, gpus, parse_policy(policy).build())
    publish_plan(plan)
    return plan


@flow(name="plan-file")
def plan_flow(jobs_file: str, gpus: int | None = None, policy: str | None = None) -> Plan:
    spec = load_jobs_file(Path(jobs_file))
    capacity = gpus or spec.gpus
    if capacity is None:
        raise ValueError("gpus: not given; pass gpus or set 'gpus' in the jobs file")
    return plan_jobs(list(spec.jobs), capacity, policy or spec.policy or "elastic_dp")
