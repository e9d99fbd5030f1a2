"""Seed 001 specs: SHA stages, placement, job-file validation with field-naming errors, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from allocator.hpo.parse import hpo_spec_from_dict
from allocator.hpo.placement import place
from allocator.hpo.spec import Billing, Latency, ParamKind, SearchParam, Stage, successive_halving
from flows.commands.cli import app
from flows.config.hpo_file import load_hpo_file

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hpo.yaml"


def test_sha_matches_the_papers_specifications() -> None:
    # Table 3: SHA(32, 1, 50, 3) -> 32, 10, 3, 1 trials over epochs 0-1, 1-4, 4-13, 13-50.
    assert successive_halving(32, 3, 1, 50) == (Stage(32, 1), Stage(10, 3), Stage(3, 9), Stage(1, 37))
    stages = successive_halving(64, 2, 4, 508)
    assert [s.trials for s in stages] == [64, 32, 16, 8, 4, 2, 1]
    assert sum(s.iters for s in stages) == 508


@pytest.mark.parametrize("args, field", [((0, 2, 1, 5), "num_trials"), ((4, 1, 1, 5), "eta"), ((4, 2, 6, 5), "max_iters")])
def test_sha_bad_parameters(args: tuple, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        successive_halving(*args)


def test_placement_colocates_and_splits_only_when_forced() -> None:
    p = place([2, 2, 1, 1, 1, 1], instances=2, gpus_per_instance=4)
    assert all(t.instances == 1 for t in p.trials)
    big = place([8, 2], instances=3, gpus_per_instance=4)
    assert big.trials[0].instances == 2 and big.trials[1].instances == 1
    forced = place([3, 3], instances=3, gpus_per_instance=2)
    assert forced.spans() == (2, 2)
    for trial in place([4, 4, 2, 2, 2, 2], 4, 4).trials:
        assert trial.instances == 1


def test_scattered_placement_splits_what_colocation_keeps_whole() -> None:
    assert place([4, 4], 2, 4).spans() == (1, 1)
    assert place([4, 4], 2, 4, scattered=True).spans() == (2, 2)


def test_placement_refuses_overflow() -> None:
    with pytest.raises(ValueError, match="demands total"):
        place([4, 4, 1], 2, 4)


def test_search_space_sampling_is_seeded_and_in_range() -> None:
    spec = load_hpo_file(EXAMPLE)
    a, b = spec.sample_configs(), spec.sample_configs()
    assert a == b and len(a) == spec.stages[0].trials
    assert all(1e-3 <= c["lr"] <= 0.3 and 0.8 <= c["momentum"] <= 0.99 for c in a)
    choice = SearchParam("w", ParamKind.CHOICE, choices=(8, 16))
    assert {choice.sample(np.random.default_rng(i)) for i in range(20)} == {8, 16}


def test_example_file_loads() -> None:
    spec = load_hpo_file(EXAMPLE)
    assert spec.cloud.billing is Billing.PER_INSTANCE
    assert spec.cloud.provision == Latency(10.0) and spec.trial.batch == 512
    assert [s.trials for s in spec.stages] == [64, 32, 16, 8, 4, 2, 1]


def _example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("deadline_s"), r"deadline_s: missing required field"),
        (lambda d: d.update(deadline_s=-5), r"deadline_s=-5"),
        (lambda d: d.update(colour="red"), r"colour: unknown field"),
        (lambda d: d.update(stages=[{"trials": 2, "iters": 3}]), r"exactly one of 'sha'"),
        (lambda d: d["sha"].update(eta=1), r"eta=1"),
        (lambda d: d["trial"].update(batch=0), r"batch=0"),
        (lambda d: d["trial"].update(profile="nope"), r"trial.profile='nope': no such profile"),
        (lambda d: d["trial"]["profile"].pop("num_params"), r"trial.profile.num_params: missing"),
        (lambda d: d["trial"].update(startup_s={"mean_s": 1, "sd": 2}), r"trial.startup_s.sd: unknown field"),
        (lambda d: d["trial"].update(max_gpus_per_trial=1000), r"max_gpus_per_trial=1000"),
        (lambda d: d["cloud"].update(billing="per_hour"), r"cloud.billing='per_hour'"),
        (lambda d: d["cloud"].update(granularity_s=0), r"granularity_s=0"),
        (lambda d: d["cloud"]["instance"].update(gpus=0), r"gpus=0"),
        (lambda d: d["cloud"]["instance"].pop("hourly_price"), r"cloud.instance.hourly_price: missing"),
        (lambda d: d["search_space"].update(lr={"loguniform": [0, 1]}), r"search_space.lr.*low=0"),
        (lambda d: d["search_space"].update(lr={"gaussian": [0, 1]}), r"search_space.lr.gaussian: unknown distribution"),
        (lambda d: d.update(entrypoint="no_colon"), r"entrypoint='no_colon'"),
    ],
)
def test_validation_errors_name_the_field(edit, message: str) -> None:  # noqa: ANN001
    data = _example()
    edit(data)
    with pytest.raises(ValueError, match=message):
        hpo_spec_from_dict(data)


def test_explicit_stages_must_not_grow() -> None:
    data = _example()
    del data["sha"]
    data["stages"] = [{"trials": 2, "iters": 3}, {"trials": 4, "iters": 3}]
    with pytest.raises(ValueError, match=r"stages\[1\].trials=4"):
        hpo_spec_from_dict(data)


def test_profile_path_is_read_relative_to_the_file(tmp_path: Path) -> None:
    data = _example()
    (tmp_path / "p.json").write_text(json.dumps(data["trial"]["profile"]))
    data["trial"]["profile"] = "p.json"
    (tmp_path / "job.json").write_text(json.dumps(data))
    assert load_hpo_file(tmp_path / "job.json").trial.profile.workload == "resnet50-v100"
    data["trial"]["profile"] = "missing.json"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="no such profile file"):
        load_hpo_file(tmp_path / "bad.yaml")


runner = CliRunner()


def test_cli_plan_json_reports_plan_static_and_ratio() -> None:
    result = runner.invoke(app, ["hpo", "plan", str(EXAMPLE), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["plan"]["meets_deadline"] and report["static"]["meets_deadline"]
    assert report["cost_ratio_vs_static"] == pytest.approx(report["plan"]["cost"] / report["static"]["cost"], rel=1e-3)
    assert len(report["plan"]["stages"]) == 7


def test_cli_plan_table() -> None:
    result = runner.invoke(app, ["hpo", "plan", str(EXAMPLE), "--deadline", "1500"])
    assert result.exit_code == 0, result.output
    assert "cost vs static" in result.output and "static" in result.output


@pytest.mark.parametrize(
    "args, code, text",
    [
        (["hpo", "plan", "missing.yaml"], 2, "no such file"),
        (["hpo", "plan", str(EXAMPLE), "--deadline", "5"], 1, "infeasible"),
        (["hpo", "plan", str(EXAMPLE), "--samples", "-1"], 2, "--samples=-1"),
        (["hpo", "plan", str(EXAMPLE), "--deadline", "-3"], 2, "deadline_s=-3"),
    ],
)
def test_cli_plan_bad_input_is_one_line(args: list[str], code: int, text: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == code
    assert text in result.output and "Traceback" not in result.output


def test_cli_run_needs_an_entrypoint() -> None:
    result = runner.invoke(app, ["hpo", "run", str(EXAMPLE)])
    assert result.exit_code == 2
    assert "entrypoint: missing" in result.output and "Traceback" not in result.output


def test_trial_entrypoint_round_trips_through_the_attribute_name() -> None:
    from elastic_tasks.hpo_trial import TrialRecipeSpec, decode, trial_entrypoint
    from elastic_tasks.recipe import load_entry_point

    spec = TrialRecipeSpec("elastic_tasks.examples:mlp_tiny", 64, lr=0.125)
    entry = trial_entrypoint(spec)
    assert decode(entry.partition(":")[2]) == spec
    recipe = load_entry_point(entry)
    assert recipe.base_lr == 0.125 and recipe.base_batch == 64
    with pytest.raises(ValueError, match="TrialRecipeSpec.lr"):
        TrialRecipeSpec("a.b:c", 64, lr=-1.0)


def test_cli_plan_monte_carlo_reports_samples_and_spread() -> None:
    result = runner.invoke(app, ["hpo", "plan", str(EXAMPLE), "--samples", "5", "--seed", "1", "-f", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["plan"]["samples"] == 5 and report["static"]["samples"] == 5
