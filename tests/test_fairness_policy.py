"""The fairness layer around a policy: one decision of the loop (preempt, admit, allocate) on random
clusters, and whole simulated runs on small worked cases.

Oracles are computed here from first principles: a team's guarantee is min(its quota, the GPUs
its jobs could use) — every job here can start on one GPU, so only the jobs' largest counts
limit it — and a GPU is usable by a job below its largest count (throughput rises with every
GPU: no allreduce cost) or by a queued job."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.admission import OverflowMode, reallocate
from allocator.fairness.policy import fair
from allocator.fairness.priority import PRIORITY_CLASSES
from allocator.fairness.teams import Team, TeamTable
from allocator.loop import LoopSettings
from allocator.policies import make_policy
from allocator.simulator import RescaleCost, simulate
from allocator.types import ClusterSnapshot, JobSpec, RescaleKind, RunningJob, Share, validate_allocation
from tests.factories import make_job, make_profile

# Throughput rises with every GPU up to a job's largest count: no allreduce cost, batch >= GPUs.
LINEAR = make_profile(latency_s=0.0, seconds_per_param=0.0, cap=256)
TEAMS = ("a", "b", "c")
BATCHES = st.sampled_from([256, 256, 256, 2, 3])  # mostly roomy; some jobs can use fewer GPUs than their largest count


def job(job_id: str, team: str, max_gpus: int, samples: int = 1_000_000, max_batch: int = 256, **kw) -> JobSpec:
    return make_job(job_id, profile=LINEAR, team=team, max_gpus=max_gpus, min_batch=min(16, max_batch), max_batch=max_batch, total_samples=samples, **kw)


def usable(j: JobSpec, capacity: int) -> int:
    """The most GPUs a job can use: its largest count, at most one per sample of its largest batch."""
    return min(j.max_gpus, j.max_batch, capacity)


@st.composite
def clusters(draw):
    """A cluster mid-run: teams with quotas (summing to at most the capacity), running jobs with
    shares that fit, queued jobs; every job elastic from one GPU up to its largest count."""
    capacity = draw(st.integers(2, 24))
    names = TEAMS[: draw(st.integers(2, 3))]
    quotas, left = {}, capacity
    for n in names:
        quotas[n] = draw(st.integers(0, left))
        left -= quotas[n]
    running, queued, used = [], [], 0
    for i in range(draw(st.integers(0, 8))):
        spec = job(f"r{i}", draw(st.sampled_from(names)), draw(st.integers(1, 8)), priority=draw(st.sampled_from([0, 0, 0, 100])), max_batch=draw(BATCHES))
        if used < capacity:
            gpus = draw(st.integers(1, min(usable(spec, capacity), capacity - used)))
            used += gpus
            running.append(RunningJob(spec, Share(gpus, 256), samples_done=float(draw(st.integers(0, 900_000)))))
    for i in range(draw(st.integers(0, 6))):
        queued.append(job(f"q{i}", draw(st.sampled_from(names)), draw(st.integers(1, 8)), priority=draw(st.sampled_from([0, 0, 0, 100])), max_batch=draw(BATCHES), arrival_time=float(i)))
    table = TeamTable(tuple(Team(n, quota=quotas[n]) for n in names) + (Team("default", quota=0),))
    return ClusterSnapshot(time=10.0, capacity=capacity, running=tuple(running), queued=tuple(queued)), table, quotas


def _decide(snapshot: ClusterSnapshot, table: TeamTable, inner: str):
    policy = fair(make_policy(inner), table, strict_fifo=False)
    decision = reallocate(snapshot, policy, OverflowMode.QUEUE, strict_fifo=False)
    preempted = {j.id for j in decision.preempted}
    live = [r.spec for r in snapshot.running if r.spec.id not in preempted] + list(decision.admission.admitted)
    trial = ClusterSnapshot(time=snapshot.time, capacity=snapshot.capacity, running=tuple(RunningJob(s) for s in live))
    validate_allocation(decision.allocation, trial, required=[s.id for s in live])
    return decision, live


@settings(max_examples=100, deadline=None)
@given(clusters(), st.sampled_from(["elastic_dp", "goodput_dp"]))
def test_no_team_below_its_quota_while_it_has_demand(case, inner):
    snapshot, table, quotas = case
    decision, _ = _decide(snapshot, table, inner)
    held = {n: 0 for n in quotas}
    for job_id, share in decision.allocation.shares:
        held[next(j.team for j in snapshot.jobs if j.id == job_id)] += share.gpus
    for team, quota in quotas.items():
        # Its jobs, running or queued, could use their largest counts (each can start on one GPU).
        demand = sum(usable(j, snapshot.capacity) for j in snapshot.jobs if j.team == team)
        assert held[team] >= min(quota, demand), (team, held, quotas, demand)


@settings(max_examples=100, deadline=None)
@given(clusters(), st.sampled_from(["elastic_dp", "goodput_dp"]))
def test_no_gpu_idle_while_any_job_can_use_it(case, inner):
    snapshot, table, _ = case
    decision, live = _decide(snapshot, table, inner)
    idle = snapshot.capacity - decision.allocation.total_gpus
    if idle > 0:
        # Every job that runs is at its largest count, and nothing waits that could start.
        assert all(decision.allocation[s.id].gpus == usable(s, snapshot.capacity) for s in live), (idle, decision.allocation)
        assert not decision.admission.queued, (idle, decision.admission.queued)


def seed000_rate(j: JobSpec, k: int, overhead: float, rate: float, latency: float, per_param: float) -> float:
    """Samples/s on k GPUs at the job's best batch, from seed 000's model written out here:
    b / (overhead + ceil(b/k)/rate + ring allreduce), b within the job's range and k x the memory cap."""
    comm = 0.0 if k == 1 else 2 * (k - 1) * latency + 2 * (k - 1) / k * j.profile.num_params * per_param
    batches = range(max(j.min_batch, k), min(j.max_batch, k * j.profile.max_batch_per_gpu) + 1)
    return max((b / (overhead + math.ceil(b / k) / rate + comm) for b in batches), default=-math.inf)


@settings(max_examples=100, deadline=None)
@given(clusters(), st.floats(1e-4, 5e-3), st.floats(0.5e-9, 3e-9))
def test_no_gpu_idle_while_any_job_can_use_it_when_more_gpus_can_slow_a_job(case, latency, per_param):
    """Allreduce costs: past some count a job's throughput falls, so its inner policy leaves GPUs
    unused; those go to the other teams' jobs that can still use them."""
    snapshot, table, _ = case
    profile = make_profile(latency_s=latency, seconds_per_param=per_param, cap=256, overhead_s=0.005, rate=2_000.0)
    swap = lambda j: dataclasses.replace(j, profile=profile)  # noqa: E731
    snapshot = ClusterSnapshot(
        time=snapshot.time, capacity=snapshot.capacity, running=tuple(dataclasses.replace(r, spec=swap(r.spec)) for r in snapshot.running), queued=tuple(swap(q) for q in snapshot.queued)
    )
    decision, live = _decide(snapshot, table, "elastic_dp")
    idle = snapshot.capacity - decision.allocation.total_gpus
    if idle > 0:
        for s in live:
            k = decision.allocation[s.id].gpus
            if k < min(s.max_gpus, snapshot.capacity):
                more, now = (seed000_rate(s, n, 0.005, 2_000.0, latency, per_param) for n in (k + 1, k))
                assert more <= now * (1 + 1e-9), (s.id, k, more, now, idle)
        assert not decision.admission.queued, (idle, decision.admission.queued)


def test_a_borrowed_gpu_comes_back_by_shrinking_in_place_and_the_borrower_grows_back():
    table = TeamTable((Team("a", quota=2), Team("b", quota=2)))
    jobs = [job("a-job", "a", 4, samples=4_000_000), job("b-job", "b", 4, samples=300_000, arrival_time=50.0)]
    result = simulate(jobs, fair(make_policy("goodput_dp"), table), 4, LoopSettings(interval_s=30.0, react_to_events=False))
    a = [(r.time, r.gpus) for r in result.schedule if r.job_id == "a-job"]
    b = [(r.time, r.gpus) for r in result.schedule if r.job_id == "b-job"]
    assert a[0] == (0.0, 4)
    assert a[1] == (60.0, 2) and b[0] == (60.0, 2)  # the first tick after b arrived (50 s): within one interval
    assert [e.kind for e in result.events if e.job_id == "a-job"][:2] == [RescaleKind.START, RescaleKind.IN_PLACE]
    b_end = result.record("b-job").finish
    assert a[2][1] == 4 and 0.0 <= a[2][0] - b_end <= 30.0  # a grows back at the first tick after b ended
    assert not any(e.kind is RescaleKind.RESTART for e in result.events)


def test_where_shrinking_cannot_return_the_quota_the_borrower_yields_whole_jobs_and_resumes_them_later():
    # Team a started four one-GPU-minimum jobs on b's idle quota; b's job needs its 2 back.
    table = TeamTable((Team("a", quota=2), Team("b", quota=2)))
    jobs = [job(f"a{i}", "a", 1, samples=(i + 1) * 400_000) for i in range(4)] + [job("b0", "b", 2, samples=400_000, arrival_time=5.0)]
    cost = RescaleCost(restart_s=10.0)
    result = simulate(jobs, fair(make_policy("elastic_dp"), table), 4, LoopSettings(interval_s=30.0, react_to_events=True), cost)
    stops = [e for e in result.events if e.kind is RescaleKind.STOP and e.time == 5.0]
    # The two with the most work left yield (they lose least by waiting), b runs on its quota at once.
    assert sorted(e.job_id for e in stops) == ["a2", "a3"]
    assert [(r.time, r.gpus) for r in result.schedule if r.job_id == "b0"][0] == (5.0, 2)
    restarts = [e for e in result.events if e.kind is RescaleKind.RESTART]
    assert sorted(e.job_id for e in restarts) == ["a2", "a3"] and all(e.cost_s == 10.0 for e in restarts)
    for r in result.jobs:  # nobody's work is lost: every job finishes all of its samples
        assert r.finish is not None and r.samples_done == next(j.total_samples for j in jobs if j.id == r.job_id)
    assert result.record("a3").start == 0.0  # its first start stays its start


def test_a_nightly_job_grows_to_its_largest_count_inside_its_team_share_before_default_jobs_keep_theirs():
    nightly = PRIORITY_CLASSES["nightly"]
    table = TeamTable((Team("a", quota=5), Team("b", quota=3)))
    running = (
        RunningJob(job("a0", "a", 4), Share(3, 256), samples_done=900_000.0),
        RunningJob(job("a1", "a", 4), Share(2, 256), samples_done=100_000.0),
        RunningJob(job("b0", "b", 3), Share(3, 256)),
    )
    snapshot = ClusterSnapshot(time=0.0, capacity=8, running=running, queued=(job("n", "a", 4, priority=nightly),))
    decision = reallocate(snapshot, fair(make_policy("elastic_dp"), table), OverflowMode.QUEUE)
    # a's 5: the nightly job's 4 first, then one default job's minimum: the one with more work left yields.
    assert [j.id for j in decision.preempted] == ["a1"]
    assert [j.id for j in decision.admission.admitted] == ["n"]
    assert {jid: s.gpus for jid, s in decision.allocation.shares} == {"a0": 1, "b0": 3, "n": 4}
    # Without the class the newcomer shares a's 5 with the others as an equal: nobody yields.
    plain = reallocate(ClusterSnapshot(time=0.0, capacity=8, running=running, queued=(job("n", "a", 4),)), fair(make_policy("elastic_dp"), table), OverflowMode.QUEUE)
    assert not plain.preempted and plain.allocation["n"].gpus < 4 and plain.allocation.total_gpus == 8
