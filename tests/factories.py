"""Small builders for test data: profiles and jobs with sensible defaults."""

from __future__ import annotations

from allocator.types import AllreduceModel, JobSpec, ThroughputProfile


def make_profile(
    name: str = "w",
    num_params: int = 10_000_000,
    overhead_s: float = 0.005,
    rate: float = 2_000.0,
    cap: int = 256,
    latency_s: float = 1e-4,
    seconds_per_param: float = 1e-9,
) -> ThroughputProfile:
    """t_proc(b) = overhead + b / rate measured at powers of two up to the cap."""
    sizes = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if b <= cap)
    return ThroughputProfile(
        workload=name,
        num_params=num_params,
        batch_sizes=sizes,
        iter_times_s=tuple(overhead_s + b / rate for b in sizes),
        max_batch_per_gpu=cap,
        allreduce=AllreduceModel(latency_s=latency_s, seconds_per_param=seconds_per_param),
    )


def make_job(job_id: str = "j", profile: ThroughputProfile | None = None, **overrides: object) -> JobSpec:
    fields: dict[str, object] = dict(
        id=job_id,
        workload="w",
        total_samples=100_000,
        min_batch=16,
        max_batch=256,
        max_gpus=8,
        profile=profile or make_profile(),
    )
    fields.update(overrides)
    return JobSpec(**fields)  # type: ignore[arg-type]
