"""`malleable profile --noise`: a recipe's noise-scale trajectory measured and written into its profile."""

import json

from typer.testing import CliRunner

from allocator.physics.noise import NoiseTrajectory
from allocator.profiles.io import profile_from_dict
from allocator.specs import jobs_file_from_dict
from flows.commands.cli import app

runner = CliRunner(env={"COLUMNS": "200"})
FAST = ["--batches", "4,8", "--repeats", "1", "--warmup", "0", "--gpus-for-allreduce", "1", "--threads", "1"]
NOISE = ["--noise", "--noise-batch", "32", "--noise-micro", "8", "--noise-epochs", "0.25", "--noise-points", "4"]


def test_profile_writes_the_measured_trajectory_and_jobs_take_it(tmp_path):
    out = tmp_path / "mlp.json"
    result = runner.invoke(app, ["profile", "elastic_tasks.examples:mlp_tiny", *FAST, *NOISE, "--out", str(out)])
    assert result.exit_code == 0, result.output
    printed = " ".join(result.output.split())  # the table title may wrap
    assert "gradient noise scale over 16 steps at batch 32" in printed
    data = json.loads(out.read_text())
    values = data["noise_scale"]["values"]
    assert len(values) == 4 and all(v > 0 for v in values)
    # Points at 1/4, 2/4, 3/4 and 4/4 of the run; each value holds halfway to its neighbours.
    assert data["noise_scale"]["fractions"] == [0.0, 0.375, 0.625, 0.875]
    profile = profile_from_dict(data)
    assert profile.noise_scale == NoiseTrajectory((0.0, 0.375, 0.625, 0.875, 1.0), tuple(values))
    job = {"id": "a", "profile": "mlp", "samples": 1000, "min_batch": 8, "max_batch": 64, "max_gpus": 2}
    (spec,) = jobs_file_from_dict({"jobs": [job]}, {"mlp": profile}).jobs
    assert spec.noise_scale == profile.noise_scale


def test_a_noise_run_too_short_or_without_two_batch_sizes_is_one_line(tmp_path):
    for extra, message in (
        (["--noise-micro", "32"], "noise micro batch=32: must be an integer in [1, batch=32)"),
        (["--noise-epochs", "0.01"], "noise epochs=0.01: 0 steps at batch 32"),
        (["--noise-epochs", "0"], "--noise-epochs=0.0: must be > 0"),
    ):
        args = ["profile", "elastic_tasks.examples:mlp_tiny", *FAST, *NOISE, *extra, "--out", str(tmp_path / "x.json")]
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert not (tmp_path / "x.json").exists()
