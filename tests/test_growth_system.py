"""Issue 26's growth scenario for real: the scheduler service on 2 gloo workers, job A with no
offline profile (the neutral prior), job B arriving later; A shrinks for B and grows back when
B ends. A must not be left on 2 GPUs at a configuration that measured slower than the best it
measured there; every generation records predicted and measured samples/s in the store and in
the job's MLflow run, and the job's record splits its wall time into named parts.

No wall-time bound is asserted: the checks are on the decisions the service made from the
figures it recorded (which configuration it left the job in, given what each measured)."""

from __future__ import annotations

import pytest

from benchmarks.growth_bench import run_growth
from allocator.profiles.measured import TrustSettings

pytestmark = pytest.mark.slow

TOLERANCE = TrustSettings().tolerance


def test_a_job_that_ran_fast_on_two_gpus_is_not_left_slower_there_after_it_grows_back(tmp_path):
    # B arrives once A has run (and measured) on both workers — counted in samples, not seconds,
    # so a fast machine does not finish A before B ends, nor a loaded one start B too early.
    # 20 000 (the benchmark's default; 12 000 once left A's first generation unmeasured on CI's
    # loaded box: too few of its steps seen by the loop's polls before B arrived).
    run = run_growth(tmp_path, "resnet_small", samples_a=60_000, samples_b=6_000, interval_s=3.0, b_after_samples=20_000)
    a, b = run.a, run.b
    b_start = b[0].time
    assert [g for g in a if g.gpus == 2 and g.time < b_start and g.measured is not None], f"A never measured both workers before B: {a}"
    assert any(g.gpus == 1 for g in a), f"A never shrank for B: {a}"
    grown = [g for g in a if g.gpus == 2 and g.time >= run.b_finished_at - 1.0]
    assert grown, f"A never grew back after B: {a}"

    # Every generation carries the model's prediction; those that ran long enough, a measurement.
    assert all(g.predicted is not None and g.predicted > 0 for g in a + b)
    measured_2 = [g for g in a if g.gpus == 2 and g.measured is not None]
    assert len(measured_2) >= 2, f"too few measured 2-GPU generations to compare: {a}"

    # The decision rule, checked on the figures the service recorded: the configuration A is left
    # at on 2 GPUs is the best it measured there, or one that measured within the tolerance of it.
    last = grown[-1]
    earlier = [g for g in measured_2 if g is not last]
    best = max(earlier, key=lambda g: g.measured)
    same_config = (last.gpus, last.batch) == (best.gpus, best.batch)
    assert same_config or (last.measured is not None and last.measured >= (1 - TOLERANCE) * best.measured), (
        f"A left at {last.gpus} x {last.batch} ({last.measured}) after measuring {best.gpus} x {best.batch} at {best.measured}: {a}"
    )
    # A configuration that measured worse than the best on 2 GPUs ran at most once (remembered).
    worse = [(g.gpus, g.batch) for g in measured_2 if g.measured < (1 - TOLERANCE) * max(x.measured for x in measured_2)]
    assert len(worse) == len(set(worse)) <= TrustSettings().max_explorations

    # MLflow: the job's run holds the same figures.
    assert len(run.mlflow_a["predicted_samples_per_s"]) >= len(a)
    assert len(run.mlflow_a["measured_samples_per_s"]) >= len(measured_2)

    # The job's record splits its wall time; the parts add up to it (by construction: what no part
    # covers is reported as unaccounted, not hidden), and steps hold some of it.
    split = run.wall_split_a
    assert split is not None
    parts = sum(v for k, v in split.items() if k != "wall_s")
    assert parts == pytest.approx(split["wall_s"], rel=1e-3)
    assert split["steps_s"] > 0 and split["start_s"] > 0 and split["checkpoint_s"] > 0
