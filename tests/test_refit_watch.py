"""A job's status reports become step observations (warm-up skipped, one per interval of a
generation) and a refitted profile; the loop hands that profile to the policy."""

import dataclasses

import pytest

from allocator.loop import LoopSettings, run_loop
from allocator.policies import make_policy
from allocator.simulator.clock import SimClock
from allocator.simulator.executor import SimExecutor
from allocator.physics.throughput import t_comm, t_proc
from allocator.types import AllreduceModel
from elastic_tasks.board import JobStatus
from elastic_tasks.coordinator.refit_watch import JobRefit, RefitSettings, StepWatch
from tests.factories import make_job, make_profile


def report(version, step, seconds_per_step, world=2, batch=96, t0=1000.0, accum=1):
    """Rank 0's status after ``step`` steps of a generation that runs ``seconds_per_step`` per step."""
    return JobStatus(version, step, step * batch, world, batch, 1.0, t0 + step * seconds_per_step, accum_steps=accum)


def test_intervals_of_one_generation_after_its_warm_up():
    watch = StepWatch(warmup_steps=3)
    steps = [5, 7, 9, 12, 12, 20]  # first seen at step 5: warm-up until step 8, so 9 opens the first interval
    out = [watch.observe(report(0, s, 0.25, accum=3), hosts=1) for s in steps]
    assert [len(o) for o in out] == [0, 0, 0, 12 - 9, 0, 20 - 12]  # one per step of the interval
    # 96 samples over 2 ranks = 48 each; the 3 micro-steps the ranks reported make micro-batches of 16.
    for obs in out[3] + out[5]:
        assert (obs.gpus, obs.micro_batch, obs.accum_steps, obs.hosts) == (2, 16, 3, 1)
        assert obs.seconds == pytest.approx(0.25)


def test_no_interval_spans_two_generations_or_a_report_with_unknown_hosts():
    watch = StepWatch(warmup_steps=0)
    assert watch.observe(None, hosts=1) == []
    assert watch.observe(report(0, 10, 0.1), 1) == []  # first of generation 0: anchors only
    assert watch.observe(report(0, 20, 0.1), 1) == []  # warm-up 0: this one opens the interval
    obs, *more = watch.observe(report(0, 30, 0.1), 1)
    assert len(more) == 9 and set(more) == {obs}
    assert obs.seconds == pytest.approx(0.1) and (obs.gpus, obs.micro_batch, obs.accum_steps) == (2, 48, 1)
    # Generation 1: one rank, batch 40 (t0 moved: another rank 0). Its first report only anchors.
    assert watch.observe(report(1, 31, 0.3, world=1, batch=40, t0=5000.0), 1) == []
    assert watch.observe(report(1, 35, 0.3, world=1, batch=40, t0=5000.0), 1) == []
    assert watch.observe(report(1, 38, 0.3, world=1, batch=40, t0=5000.0), None) == []  # hosts unknown: ends nothing
    obs, *more = watch.observe(report(1, 42, 0.3, world=1, batch=40, t0=5000.0), 1)
    assert len(more) == 42 - 38 - 1
    assert (obs.gpus, obs.micro_batch, obs.accum_steps, obs.seconds) == (1, 40, 1, pytest.approx(0.3))
    watch.restart()  # a new coordinator: version 0 again is a new generation
    assert watch.observe(report(0, 50, 0.1), 1) == []


def generation(refit, version, world, batch, seconds, steps, hosts=1):
    for s in range(0, steps + 1, 2):
        refit.observe(report(version, 100 * version + s, seconds, world, batch), hosts)


def test_refitted_profile_predicts_the_measured_step_and_keeps_unmeasured_allreduce():
    # The prior is half again slower than the job runs, and knows an inter-host allreduce.
    prior = dataclasses.replace(make_profile(overhead_s=0.0125, rate=500.0, cap=64), inter_host=AllreduceModel(1e-3, 5e-9))
    refit = JobRefit(prior, RefitSettings(warmup_steps=2))
    assert refit.profile() is None
    generation(refit, 0, 1, 32, 0.05, 60)  # the job: 0.05 s a step at 32 samples (the prior says 0.0125 + 32 / 500 = 0.0765)
    first = refit.profile()
    assert first is not None and first.max_batch_per_gpu == 64 and first.num_params == prior.num_params
    assert float(t_proc(first, 32)) == pytest.approx(0.05, rel=0.01)
    assert first.allreduce == prior.allreduce and first.inter_host == prior.inter_host  # one rank says nothing about them
    generation(refit, 1, 2, 64, 0.07, 60)  # 2 ranks of 32 on one host: 0.05 s of compute, 0.02 s of allreduce
    second = refit.profile()
    modelled = float(t_proc(second, 32)) + float(t_comm(second.allreduce, second.num_params, 2))
    assert modelled == pytest.approx(0.07, rel=0.01) and second.allreduce != prior.allreduce
    assert second.inter_host == prior.inter_host


class ProfilingSimExecutor(SimExecutor):
    """A simulator that also reports a refitted profile: each running job at twice its spec's times."""

    def profile(self, job_id, now):
        spec = self._specs[job_id]
        return dataclasses.replace(spec.profile, iter_times_s=tuple(2 * t for t in spec.profile.iter_times_s))

    def apply(self, now, previous, new, jobs):
        self._specs = dict(jobs)
        return super().apply(now, previous, new, jobs)


class SeenProfiles:
    def __init__(self, inner):
        self.inner, self.name, self.seen = inner, "seen", []

    def allocate(self, snapshot):
        self.seen += [(r.spec.id, r.spec.profile.iter_times_s) for r in snapshot.running if r.share is not None]
        return self.inner.allocate(snapshot)

    def min_gpus(self, job, capacity):
        return self.inner.min_gpus(job, capacity)


def test_the_loop_puts_a_reported_profile_into_the_snapshot_and_none_changes_nothing():
    profile = make_profile(rate=2_000.0)
    jobs = [make_job("a", profile, total_samples=200_000, max_gpus=4), make_job("b", profile, total_samples=50_000, arrival_time=20.0, max_gpus=4)]
    reporting, plain = SeenProfiles(make_policy("elastic_dp")), SeenProfiles(make_policy("elastic_dp"))
    run_loop(jobs, reporting, 4, SimClock(), ProfilingSimExecutor(), LoopSettings(interval_s=15.0))
    run_loop(jobs, plain, 4, SimClock(), SimExecutor(), LoopSettings(interval_s=15.0))
    doubled = tuple(2 * t for t in profile.iter_times_s)
    assert reporting.seen and all(times == doubled for _, times in reporting.seen)
    assert plain.seen and all(times == profile.iter_times_s for _, times in plain.seen)
