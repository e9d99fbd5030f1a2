"""Hypothesis strategies shared by the policy tests: profiles, jobs and snapshots.

Jobs are *mostly runnable*: nine in ten draw their batch range so that some GPU count in
[min_gpus, max_gpus] fits it (and the requested count fits a non-elastic job's fixed batch);
one in ten is drawn freely, so infeasible cases stay covered without dominating. Snapshots
draw their capacity mostly at or above what the jobs' requested counts need together, so a
property test compares real allocations rather than two "infeasible"s.
"""

from __future__ import annotations

from hypothesis import strategies as st

from allocator.policies import make_policy
from allocator.types import ClusterSnapshot, InfeasibleError, JobSpec, RunningJob, Share
from tests.factories import make_job, make_profile

# t_proc(c) = overhead + c / rate, measured at powers of two up to the memory cap.
profiles = st.builds(
    make_profile,
    num_params=st.integers(1_000_000, 100_000_000),
    overhead_s=st.floats(0.001, 0.05),
    rate=st.floats(200.0, 20_000.0),
    cap=st.sampled_from([16, 32, 64, 128, 256]),
    latency_s=st.floats(0.0, 1e-3),
    seconds_per_param=st.floats(0.0, 5e-9),
)


@st.composite
def jobs(draw, index: int, max_gpus: int = 16, max_min_gpus: int = 1) -> JobSpec:
    profile = draw(profiles)
    cap = profile.max_batch_per_gpu
    top = draw(st.integers(1, max_gpus))
    least = draw(st.integers(1, min(top, max_min_gpus)))
    requested = draw(st.integers(least, top))
    if draw(st.integers(0, 9)):
        # Runnable on the requested count: requested <= batch <= requested * cap.
        lo = draw(st.integers(requested, min(1024, requested * cap)))
        hi = draw(st.integers(lo, min(1024, requested * cap, 4 * lo)))
    else:
        lo = draw(st.integers(1, 256))
        hi = draw(st.integers(lo, 1024))
    return make_job(
        f"j{index}",
        profile=profile,
        total_samples=draw(st.integers(1_000, 10_000_000)),
        min_batch=lo,
        max_batch=hi,
        max_gpus=top,
        min_gpus=least,
        requested_gpus=requested,
        elastic=draw(st.booleans()),
        arrival_time=float(index),
    )


@st.composite
def job_lists(draw, max_jobs: int = 6, max_gpus: int = 16, max_min_gpus: int = 1) -> list[JobSpec]:
    return [draw(jobs(i, max_gpus, max_min_gpus)) for i in range(draw(st.integers(0, max_jobs)))]


@st.composite
def capacities(draw, specs: list[JobSpec], max_capacity: int) -> int:
    """Mostly enough for every job's requested count (up to max_capacity), sometimes anything."""
    need = sum(j.requested_gpus for j in specs)
    if need <= max_capacity and draw(st.integers(0, 9)):
        return draw(st.integers(max(1, need), max_capacity))
    return draw(st.integers(1, max_capacity))


@st.composite
def snapshots(draw, max_jobs: int = 6, max_capacity: int = 24, max_gpus: int = 16) -> ClusterSnapshot:
    specs = draw(job_lists(max_jobs, max_gpus))
    return ClusterSnapshot(time=0.0, capacity=draw(capacities(specs, max_capacity)), queued=tuple(specs))


@st.composite
def snapshots_with_running(draw, max_jobs: int = 7, max_capacity: int = 24) -> ClusterSnapshot:
    """Some jobs running (with progress, and a share from a feasible earlier allocation), the rest queued."""
    specs = draw(job_lists(max_jobs, max_min_gpus=3))
    capacity = draw(capacities(specs, max_capacity))
    n_running = draw(st.integers(0, len(specs)))
    running_specs, queued = specs[:n_running], specs[n_running:]
    shares: dict[str, Share] = {}
    if running_specs and draw(st.booleans()):
        try:
            earlier = make_policy("elastic_dp").allocate(ClusterSnapshot(time=0.0, capacity=capacity, queued=tuple(running_specs)))
            shares = earlier.as_dict()
        except InfeasibleError:
            shares = {}
    running = tuple(
        RunningJob(spec, shares.get(spec.id), draw(st.floats(0.0, 1.0)) * spec.total_samples) for spec in running_specs
    )
    return ClusterSnapshot(time=100.0, capacity=capacity, running=running, queued=tuple(queued))
