"""One physics per run: jobs with noise scales run every policy on goodput, from the CLI and the
Python API alike; policy parameters the physics cannot honour are refused; batch-only changes
cost the batch-change cost, not a rescale."""

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from allocator.loop import LoopSettings
from allocator.metrics import schedule_csv
from allocator.physics.choice import Physics, physics_of
from allocator.plan import make_plan
from allocator.policies import make_policy
from allocator.simulator import RescaleCost, simulate
from allocator.simulator.executor import classify
from allocator.types import RescaleKind, Share
from flows.commands.cli import app
from flows.config.jobfile import load_jobs_file
from tests.factories import make_job, make_profile

runner = CliRunner(env={"COLUMNS": "200"})
OVERHEAD, RATE = 0.004, 2_000.0
PROFILE = {
    "workload": "tiny", "num_params": 5_000_000, "batch_sizes": [8, 16, 32, 64],
    "iter_times_s": [OVERHEAD + b / RATE for b in (8, 16, 32, 64)], "max_batch_per_gpu": 64,
    "allreduce": {"latency_s": 5e-4, "seconds_per_param": 2e-10},
}  # fmt: skip


def jobs_file(path: Path, with_noise: bool = True) -> Path:
    noise = [{"fractions": [0, 0.5], "values": [60, 400]}, 150, {"at_batch": 32, "grad_sqr": 1.0, "grad_var": 4.0}, None]
    jobs = []
    for i, (samples, arrival, n) in enumerate(zip((200_000, 100_000, 150_000, 80_000), (0, 30, 60, 90), noise)):
        job = {"id": f"j{i}", "profile": "tiny", "samples": samples, "min_batch": 16, "max_batch": 512, "max_gpus": 8, "arrival_s": arrival}
        if with_noise and n is not None:
            job["noise_scale"] = n
        jobs.append(job)
    path.write_text(yaml.safe_dump({"gpus": 8, "profiles": {"tiny": PROFILE}, "jobs": jobs}))
    return path


def test_cli_runs_three_policies_on_goodput_and_the_python_api_gives_identical_schedules(tmp_path):
    path = jobs_file(tmp_path / "jobs.yaml")
    out = tmp_path / "out"
    policies = ("goodput_dp", "elastic_dp", "fixed_batch_dp")
    args = ["simulate", str(path), *[a for p in policies for a in ("-p", p)], "--interval", "60", "--no-plots", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "goodput physics" in result.output and "3 of 4 jobs carry a noise_scale" in result.output
    summary = json.loads((out / "summary.json").read_text())["policies"]
    assert [summary[p]["physics"] for p in policies] == ["goodput"] * 3
    assert all(summary[p]["completed"] == 4 and summary[p]["avg_jct_s"] > 0 for p in policies)
    jobs = load_jobs_file(path).jobs
    assert physics_of(jobs) is Physics.GOODPUT
    for name in policies:
        api = simulate(jobs, make_policy(name), 8, LoopSettings(interval_s=60.0), RescaleCost())
        assert schedule_csv(api) == (out / f"schedule-{name}.csv").read_text(), name


def test_goodput_physics_charges_statistical_efficiency_from_first_principles(tmp_path):
    """One job pinned at batch 256 on one GPU (4 micro-steps of 64), B_noise 100, B0 = 16:
    each sample is worth (100 + 16) / (100 + 256) base samples, so its work takes that much longer."""
    job = make_job("a", make_profile("tiny", rate=RATE, overhead_s=OVERHEAD, cap=64), min_batch=16, max_batch=256,
                   fixed_batch=256, max_gpus=1, total_samples=50_000, noise_scale=None)  # fmt: skip
    from allocator.physics.noise import NoiseTrajectory

    noisy = make_job("a", job.profile, min_batch=16, max_batch=256, fixed_batch=256, max_gpus=1, total_samples=50_000,
                     base_batch=16, noise_scale=NoiseTrajectory.constant(100.0))  # fmt: skip
    step = 4 * (OVERHEAD + 64 / RATE)
    raw_rate = 256 / step
    plain = simulate([job], make_policy("fixed_batch_dp"), 1, cost=RescaleCost(start_s=0.0))
    charged = simulate([noisy], make_policy("fixed_batch_dp"), 1, cost=RescaleCost(start_s=0.0))
    assert plain.record("a").finish == pytest.approx(50_000 / raw_rate, rel=1e-9)
    assert charged.record("a").finish == pytest.approx(50_000 / (raw_rate * (100 + 16) / (100 + 256)), rel=1e-9)


def test_plan_integrates_the_noise_trajectory_at_the_planned_share():
    from allocator.physics.noise import NoiseTrajectory

    trajectory = NoiseTrajectory((0.0, 0.3, 1.0), (50.0, 500.0))
    job = make_job("a", make_profile("tiny", rate=RATE, overhead_s=OVERHEAD, cap=64), min_batch=32, max_batch=32, max_gpus=1,
                   total_samples=90_000, noise_scale=trajectory)  # fmt: skip
    plan = make_plan([job], 1, make_policy("elastic_dp"))
    rate = 32 / (OVERHEAD + 32 / RATE)  # B0 = min_batch = 32 = B: every sample is worth one
    assert plan.physics is Physics.GOODPUT
    assert plan.jobs[0].predicted_runtime_s == pytest.approx(90_000 / rate, rel=1e-9)
    wider = make_job("b", job.profile, min_batch=32, max_batch=64, fixed_batch=64, elastic=False, max_gpus=1, base_batch=32,
                     total_samples=90_000, noise_scale=trajectory)  # fmt: skip
    rate64 = 64 / (OVERHEAD + 64 / RATE)
    expected = 0.3 * 90_000 / (rate64 * 82 / 114) + 0.7 * 90_000 / (rate64 * 532 / 564)
    assert make_plan([wider], 1, make_policy("fixed_batch_dp")).jobs[0].predicted_runtime_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "with_noise, param, message",
    [
        (False, "goodput_dp:default_noise_scale=1000", "goodput_dp.default_noise_scale=1000: job 'j0' carries no noise_scale"),
        (True, "goodput_dp:default_noise_scale=1000", "goodput_dp.default_noise_scale=1000: job 'j3' carries no noise_scale"),
        (True, "goodput_dp:noise=n.json", "noise scales belong to the jobs"),
    ],
)
def test_a_parameter_the_physics_cannot_honour_is_one_line(tmp_path, with_noise, param, message):
    path = jobs_file(tmp_path / "jobs.yaml", with_noise)
    result = runner.invoke(app, ["simulate", str(path), "-p", "goodput_dp", "--param", param, "--no-plots", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_noise_file_gives_jobs_their_noise_and_a_typo_is_refused(tmp_path):
    path = jobs_file(tmp_path / "jobs.yaml", with_noise=False)
    (tmp_path / "n.json").write_text(json.dumps({"tiny": {"fractions": [0, 0.5], "values": [80, 800]}}))
    result = runner.invoke(app, ["simulate", str(path), "-p", "goodput_dp", "--noise", str(tmp_path / "n.json"), "--no-plots", "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["policies"]["goodput_dp"]["physics"] == "goodput"
    (tmp_path / "typo.json").write_text(json.dumps({"tinny": 80}))
    result = runner.invoke(app, ["simulate", str(path), "--noise", str(tmp_path / "typo.json"), "--no-plots", "-o", str(tmp_path / "o2")])
    assert result.exit_code == 2 and "noise['tinny']: names no job id or workload" in result.output


def test_without_noise_the_run_is_on_throughput_physics(tmp_path):
    path = jobs_file(tmp_path / "jobs.yaml", with_noise=False)
    result = runner.invoke(app, ["simulate", str(path), "-p", "goodput_dp", "-p", "elastic_dp", "--no-plots", "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "throughput physics" in result.output
    assert {v["physics"] for v in json.loads((tmp_path / "o" / "summary.json").read_text())["policies"].values()} == {"throughput"}


def test_a_batch_only_change_is_not_a_rescale():
    cost = RescaleCost(in_place_s=30.0, restart_s=60.0, batch_s=0.25)
    assert classify(Share(4, 256), Share(4, 512, 2), cost) == (RescaleKind.BATCH, 0.25)
    assert classify(Share(4, 256), Share(5, 256), cost) == (RescaleKind.IN_PLACE, 30.0)
    assert classify(Share(4, 256), Share(4, 128), RescaleCost(in_place=False, batch_s=0.0)) == (RescaleKind.BATCH, 0.0)


def test_goodput_dp_changes_batch_in_place_when_the_noise_scale_grows():
    """A lone job on its one GPU whose B_noise jumps at half its work: goodput_dp raises its batch on
    the same GPU, charged the batch-change cost (the loop decides again at the next tick, although
    nothing arrived or finished)."""
    from allocator.physics.noise import NoiseTrajectory

    job = make_job("a", make_profile("tiny", rate=RATE, overhead_s=OVERHEAD, cap=64), min_batch=16, max_batch=512, max_gpus=1,
                   total_samples=400_000, noise_scale=NoiseTrajectory((0.0, 0.5, 1.0), (20.0, 5000.0)))  # fmt: skip
    result = simulate([job], make_policy("goodput_dp"), 1, LoopSettings(interval_s=5.0), RescaleCost(in_place_s=30.0, batch_s=0.5))
    batch_events = [e for e in result.events if e.kind is RescaleKind.BATCH]
    assert len(batch_events) == 1 and batch_events[0].cost_s == 0.5 and batch_events[0].after.gpus == 1
    assert batch_events[0].after.global_batch > batch_events[0].before.global_batch
    # The change comes at the first tick after half the work: the time half the work took, rounded up to Δ.
    first = result.schedule[0]
    raw = first.batch / (first.accum_steps * (OVERHEAD + -(-first.batch // first.accum_steps) / RATE))
    half_time = 200_000 / (raw * (20 + 16) / (20 + first.batch))
    assert batch_events[0].time == pytest.approx(math.ceil(half_time / 5.0) * 5.0)
    assert not [e for e in result.events if e.kind is RescaleKind.IN_PLACE]


def test_the_example_jobs_file_shows_each_form_and_runs_on_goodput(tmp_path):
    example = Path(__file__).resolve().parents[1] / "examples" / "jobs-goodput.yaml"
    jobs = {j.id: j for j in load_jobs_file(example).jobs}
    assert physics_of(jobs.values()) is Physics.GOODPUT
    assert len(jobs["resnet50-a"].noise_scale.values) == 4 and jobs["alexnet-b"].noise_scale.values == (90.0,)
    assert jobs["vgg11-c"].noise_scale.values == (pytest.approx(64 * 0.6 / 0.2),) and jobs["vgg11-c"].base_batch == 64
    result = runner.invoke(app, ["simulate", str(example), "-p", "goodput_dp", "-p", "elastic_dp", "-p", "fixed_batch_dp", "--no-plots", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())["policies"]
    assert {p: (s["physics"], s["completed"]) for p, s in summary.items()} == {p: ("goodput", 4) for p in ("goodput_dp", "elastic_dp", "fixed_batch_dp")}


def test_hosts_the_physics_does_not_model_are_refused():
    import dataclasses

    from allocator.types import AllreduceModel

    profile = dataclasses.replace(make_profile("tiny", rate=RATE, overhead_s=OVERHEAD, cap=64), inter_host=AllreduceModel(1e-3, 1e-9))
    from allocator.physics.noise import NoiseTrajectory

    jobs = [make_job("a", profile, noise_scale=NoiseTrajectory.constant(100.0))]
    with pytest.raises(ValueError, match=r"^goodput_dp.hosts=4: the run's physics places jobs on one flat network"):
        simulate(jobs, make_policy("goodput_dp", hosts=4), 8)
    with pytest.raises(ValueError, match=r"^goodput_dp.hosts=None: the run's physics places jobs on hosts of 4 GPUs"):
        simulate(jobs, make_policy("goodput_dp"), 8, gpus_per_host=4)
    assert simulate(jobs, make_policy("goodput_dp", hosts=4), 8, gpus_per_host=4).record("a").finish > 0
