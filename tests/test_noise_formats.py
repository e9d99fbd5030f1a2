"""noise_scale and base_batch in jobs files, traces and profiles: each form, round trips, bad input."""

import json
import math

import numpy as np
import pytest

from allocator.physics.goodput import base_batch, raw_sample_budget
from allocator.physics.noise import NoiseTrajectory, noise_from_value
from allocator.profiles.io import profile_from_dict, profile_to_dict
from allocator.specs import jobs_file_from_dict
from allocator.workloads.trace import read_trace, write_trace
from tests.factories import make_job, make_profile

PROFILE = {"workload": "w", "num_params": 1000, "batch_sizes": [8, 16], "iter_times_s": [0.01, 0.015], "max_batch_per_gpu": 64}


def entry(**kw):
    e = {"id": "a", "profile": "p", "samples": 1000, "min_batch": 16, "max_batch": 256, "max_gpus": 4}
    e.update(kw)
    return e


def parse(*entries, profile=PROFILE):
    return jobs_file_from_dict({"jobs": list(entries)}, {"p": profile_from_dict(profile)}).jobs


def test_each_form_of_noise_scale_on_a_job():
    const, steps, stats = parse(
        entry(id="c", noise_scale=200),
        entry(id="t", noise_scale={"fractions": [0, 0.5, 0.9], "values": [100, 400, 1600]}),
        entry(id="s", noise_scale={"at_batch": 128, "grad_sqr": [2.0, 1.0], "grad_var": [1.0, 3.0], "fractions": [0, 0.4]}),
    )
    assert const.noise_scale == NoiseTrajectory((0.0, 1.0), (200.0,))
    assert [steps.noise_scale.at(f) for f in (0.0, 0.49, 0.5, 0.89, 0.9, 1.0)] == [100, 100, 400, 400, 1600, 1600]
    # B_noise = M V / S, written out: 128 * 1 / 2 and 128 * 3 / 1.
    assert stats.noise_scale == NoiseTrajectory((0.0, 0.4, 1.0), (64.0, 384.0))


def test_stated_batch_conversion_is_the_noise_scale_of_the_per_sample_gradients():
    """Draw per-sample gradients with a known mean G and covariance Σ; the variance of a mean over
    M samples measured at M (grad_var) and |G|^2 (grad_sqr) must give tr(Σ)/|G|^2."""
    rng = np.random.default_rng(0)
    dim, batch, trials = 6, 32, 20_000
    mean = rng.normal(size=dim)
    scales = rng.uniform(0.5, 3.0, size=dim)
    samples = mean + rng.normal(size=(trials, batch, dim)) * scales
    batch_means = samples.mean(axis=1)
    grad_var = float(np.sum(batch_means.var(axis=0)))  # E|g_M - G|^2, measured at batch M
    truth = float(np.sum(scales**2) / np.sum(mean**2))  # tr(Σ) / |G|^2
    got = noise_from_value({"at_batch": batch, "grad_sqr": float(np.sum(mean**2)), "grad_var": grad_var}).values[0]
    assert got == pytest.approx(truth, rel=0.03)


def test_base_batch_is_explicit_with_the_documented_default():
    free, pinned, given = parse(entry(id="f"), entry(id="p", fixed_batch=128), entry(id="g", base_batch=512))
    assert (base_batch(free), base_batch(pinned), base_batch(given)) == (16, 128, 512)
    # A B0 above every batch the job runs: each sample is worth more than one at B0 (E > 1), so
    # the raw budget is the work itself, never less.
    assert raw_sample_budget(given) == given.total_samples


def test_profile_carries_inter_host_and_noise_and_jobs_inherit_unless_they_give_their_own():
    profile = dict(PROFILE, inter_host={"latency_s": 1e-3, "seconds_per_param": 2e-9}, noise_scale={"fractions": [0, 0.5], "values": [50, 500]})
    inherits, own = parse(entry(id="i"), entry(id="o", noise_scale=7), profile=profile)
    assert inherits.noise_scale == NoiseTrajectory((0, 0.5, 1), (50, 500))
    assert own.noise_scale == NoiseTrajectory.constant(7)
    p = inherits.profile
    assert (p.inter_host.latency_s, p.inter_host.seconds_per_param) == (1e-3, 2e-9)
    assert profile_from_dict(json.loads(json.dumps(profile_to_dict(p)))) == p


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_trace_round_trip_keeps_noise_and_base_batch(fmt):
    profiles = {"w": make_profile("w")}
    jobs = [
        make_job("a", profiles["w"], noise_scale=NoiseTrajectory.constant(300.0)),
        make_job("b", profiles["w"], noise_scale=NoiseTrajectory((0.0, 0.25, 1.0), (100.0, 900.0)), base_batch=64, arrival_time=3.0),
        make_job("c", profiles["w"], arrival_time=4.0),
    ]
    assert read_trace(write_trace(jobs, fmt, profiles), fmt, profiles) == jobs


def test_trace_cells_in_each_form():
    profiles = {"w": make_profile("w")}
    text = (
        "name,submit_s,samples,min_batch,max_batch,max_gpus,profile,noise_scale,base_batch\n"
        "a,0,100,16,64,2,w,250,\n"
        "b,0,100,16,64,2,w,0:100;0.5:400,32\n"
        'c,0,100,16,64,2,w,"{""at_batch"": 10, ""grad_sqr"": 4, ""grad_var"": 2}",\n'
    )
    a, b, c = read_trace(text, "csv", profiles)
    assert (a.noise_scale.values, b.noise_scale.values, c.noise_scale.values, b.base_batch) == ((250.0,), (100.0, 400.0), (5.0,), 32)


@pytest.mark.parametrize(
    "value, message",
    [
        (-5, "job 'a' (jobs[0]).noise_scale=-5: must be a number > 0"),
        ("lots", "job 'a' (jobs[0]).noise_scale='lots': expected a number, or a mapping"),
        ({"values": [1, 2]}, "job 'a' (jobs[0]).noise_scale.fractions: missing"),
        ({"fractions": [0.1], "values": [5]}, "job 'a' (jobs[0]).noise_scale.fractions=[0.1]: must start at 0"),
        ({"values": 5, "at_batch": 3}, "job 'a' (jobs[0]).noise_scale.at_batch: give either values"),
        ({"at_batch": 3, "grad_sqr": 1}, "job 'a' (jobs[0]).noise_scale.grad_var: missing required field"),
        ({"at_batch": 3, "grad_sqr": 0, "grad_var": 1}, "job 'a' (jobs[0]).noise_scale.grad_sqr[0]=0.0: must be a finite number > 0"),
        ({"value": 3}, "job 'a' (jobs[0]).noise_scale.value: unknown field"),
    ],
)
def test_bad_noise_scale_is_one_line_naming_the_field(value, message):
    with pytest.raises(ValueError) as caught:
        parse(entry(noise_scale=value))
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_bad_base_batch_and_trace_cell():
    with pytest.raises(ValueError, match=r"job 'a'.base_batch=0: must be a positive integer"):
        parse(entry(base_batch=0))
    text = "name,submit_s,samples,min_batch,max_batch,max_gpus,profile,noise_scale\na,0,100,16,64,2,w,0:100 0.5\n"
    with pytest.raises(ValueError, match=r"^t.csv row 1, column noise_scale='0:100 0.5': expected a number"):
        read_trace(text, "csv", {"w": make_profile("w")}, source="t.csv")


def test_infinite_noise_is_allowed_and_means_no_penalty():
    (job,) = parse(entry(noise_scale=math.inf))
    assert job.noise_scale.values == (math.inf,)
