"""`malleable plan` end to end through the real CLI: the example, JSON output, every bad-input case."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.commands.cli import app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jobs.yaml"
runner = CliRunner(env={"COLUMNS": "200"})

PROFILE = {
    "workload": "w",
    "num_params": 1_000_000,
    "batch_sizes": [8, 16, 32],
    "iter_times_s": [0.01, 0.015, 0.025],
    "max_batch_per_gpu": 64,
}


def _job(**over):
    job = {"id": "a", "profile": "p", "samples": 1000, "min_batch": 8, "max_batch": 64, "max_gpus": 4}
    job.update(over)
    return job


def _write(tmp_path, data, name="jobs.yaml"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return path


def test_example_table_and_json():
    result = runner.invoke(app, ["plan", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "resnet50-a" in result.output and "efficiency" in result.output
    result = runner.invoke(app, ["plan", str(EXAMPLE), "--gpus", "8", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["capacity"] == 8 and data["gpus_used"] <= 8
    assert {j["job"] for j in data["jobs"]} | set(data["waiting"]) == {"resnet50-a", "alexnet-b", "vgg11-c", "alexnet-food-d"}
    for j in data["jobs"]:
        assert j["gpus"] >= 1 and j["samples_per_s"] > 0


def test_json_jobs_file_and_inline_profile(tmp_path):
    path = _write(tmp_path, {"gpus": 4, "jobs": [_job(profile=PROFILE)]}, "jobs.json")
    result = runner.invoke(app, ["plan", str(path), "-f", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["jobs"][0]["gpus"] >= 1


BAD = [
    ({"jobs": [{k: v for k, v in _job().items() if k != "max_batch"}]}, [], "job 'a' (jobs[0]).max_batch: missing required field"),
    ({"jobs": [_job(max_gpus=-1)]}, [], "max_gpus=-1"),
    ({"jobs": [_job(max_gpus=0)]}, [], "max_gpus=0"),
    ({"jobs": [_job(min_batch=128, max_batch=64)]}, [], "job 'a'.min_batch=128: is greater than max_batch=64"),
    ({"jobs": [_job(profile=dict(PROFILE, iter_times_s=[0.02, 0.01, 0.03]))]}, [], "non-monotone"),
    ({"jobs": [_job(profile=dict(PROFILE, batch_sizes=[], iter_times_s=[]))]}, [], "empty"),
    ({"jobs": [_job(profile="nosuch")]}, [], "profile='nosuch': no such profile"),
    ({"jobs": [_job()]}, ["--policy", "nope"], "policy='nope': unknown policy"),
    ({"jobs": [_job()]}, ["--gpus", "0"], "gpus=0"),
    ({"jobs": [_job()]}, ["--gpus", "-3"], "gpus=-3"),
    ({"gpus": -2, "jobs": [_job()]}, [], "gpus=-2"),
    ({"jobs": [_job(), _job()]}, [], "duplicate job id"),
    ({"jobs": [_job(colour="red")]}, [], "colour: unknown field"),
    ({"jobs": []}, [], "non-empty list"),
]


@pytest.mark.parametrize(("data", "args", "message"), BAD)
def test_bad_input_is_one_clear_line(tmp_path, data, args, message):
    data = dict(data)
    data.setdefault("gpus", 4)
    data["profiles"] = {"p": PROFILE}
    path = _write(tmp_path, data)
    result = runner.invoke(app, ["plan", str(path), *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    assert message in " ".join(result.output.split()), result.output
    assert len(result.output.strip().splitlines()) == 1 or len(result.output.strip()) < 400


def test_missing_and_malformed_files(tmp_path):
    result = runner.invoke(app, ["plan", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2 and "no such file" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs: [unclosed")
    result = runner.invoke(app, ["plan", str(bad)])
    assert result.exit_code == 2 and "not valid YAML" in result.output
    missing_profile = _write(tmp_path, {"gpus": 2, "profiles": {"p": "missing.json"}, "jobs": [_job()]})
    result = runner.invoke(app, ["plan", str(missing_profile)])
    assert result.exit_code == 2 and "no such profile file" in result.output
