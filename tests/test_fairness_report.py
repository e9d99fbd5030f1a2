"""Measured fairness (allocator.fairness.report): GPU-hours used vs entitled, ρ, Jain's index.

The expected figures are worked out by hand in each test from the definitions."""

from __future__ import annotations

import pytest

from allocator.fairness.policy import fair
from allocator.fairness.report import JobSpan, fairness_of, jain_index, loop_isolate, report_run
from allocator.fairness.teams import Team, TeamTable
from allocator.loop import LoopSettings
from allocator.policies import make_policy
from allocator.simulator import simulate
from tests.factories import make_job, make_profile


def test_entitled_is_the_quota_while_the_team_has_work_for_it_split_among_its_submitters():
    spans = [
        JobSpan("a1", "a", "alice", arrival=0.0, end=100.0, most_gpus=8, jct_s=100.0),
        JobSpan("a2", "a", "bob", arrival=0.0, end=50.0, most_gpus=1, jct_s=50.0),
        JobSpan("b1", "b", "carol", arrival=50.0, end=150.0, most_gpus=2, jct_s=100.0),
    ]
    used = {"a1": 8 * 50 + 6 * 50, "a2": 0.0, "b1": 2 * 100}
    report = fairness_of(spans, used, {"a": 4, "b": 4}, {"a1": 80.0, "a2": 50.0, "b1": 100.0})
    a, b = report.team("a"), report.team("b")
    # a: min(4, 9) for 0-50 and min(4, 8) for 50-100: 400 GPU-s; b: min(4, 2) for 50-150: 200.
    assert (a.entitled_gpu_h * 3600, b.entitled_gpu_h * 3600) == pytest.approx((400.0, 200.0))
    assert (a.used_gpu_h * 3600, b.used_gpu_h * 3600) == pytest.approx((700.0, 200.0))
    people = {u.name: u for u in report.submitters}
    # alice and bob share a's 4 while both have a job (0-50), alice alone after.
    assert people["alice"].entitled_gpu_h * 3600 == pytest.approx(100.0 + 200.0)
    assert people["bob"].entitled_gpu_h * 3600 == pytest.approx(100.0)
    assert people["carol"].team == "b" and people["carol"].used_gpu_h * 3600 == pytest.approx(200.0)
    # ρ = JCT / isolated JCT: 1.25, 1.0 for a; 1.0 for b.
    assert (a.max_rho, a.mean_rho, b.max_rho) == pytest.approx((1.25, 1.125, 1.0))
    assert report.max_rho == pytest.approx(1.25)
    # Jain over the teams' mean 1/ρ: a (0.8 + 1.0) / 2 = 0.9, b 1.0.
    assert report.jain == pytest.approx((0.9 + 1.0) ** 2 / (2 * (0.81 + 1.0)))


def test_jain_index_bounds():
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([]) is None


def test_the_light_team_has_rho_one_with_fairness_and_two_without():
    profile = make_profile(latency_s=0.0, seconds_per_param=0.0)
    table = TeamTable((Team("a", quota=2), Team("b", quota=2)))
    jobs = [make_job(f"a{i}", profile=profile, team="a", max_gpus=2, total_samples=400_000) for i in range(3)]
    jobs.append(make_job("b1", profile=profile, team="b", max_gpus=2, total_samples=400_000))
    settings = LoopSettings(interval_s=10.0)
    isolate = loop_isolate(lambda team_jobs, gpus: simulate(team_jobs, make_policy("elastic_dp"), gpus, settings))
    fair_run = report_run(simulate(jobs, fair(make_policy("elastic_dp"), table), 4, settings), jobs, table, isolate)
    # b alone on its 2 GPUs runs exactly as it does beside a: ρ = 1.
    assert fair_run.team("b").max_rho == pytest.approx(1.0)
    # Without fairness the four jobs get one GPU each: b's step of 256 samples takes
    # 0.005 + 256/2000 s on one GPU instead of 0.005 + 128/2000 s on its share's two.
    plain = report_run(simulate(jobs, make_policy("elastic_dp"), 4, settings), jobs, table, isolate)
    assert plain.team("b").max_rho == pytest.approx((0.005 + 256 / 2000) / (0.005 + 128 / 2000))
    assert plain.jain < fair_run.jain
