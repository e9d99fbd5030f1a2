"""``malleable simulate`` as a researcher drives it (issue 38): variants side by side, a summary
that says how it was made and reruns to the same schedules, trajectories named once, and errors
that name the parameter."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from flows.commands.cli import app

PROFILES = Path(__file__).resolve().parents[1] / "examples" / "profiles"
runner = CliRunner(env={"COLUMNS": "200"})


def write_jobs(path: Path, noise_ref: str = "shared", noise_file: bool = True) -> Path:
    """Five jobs, three of them on one trajectory written once (in a file beside the jobs file)."""
    if noise_file:
        (path.parent / "shared.json").write_text(json.dumps({"fractions": [0, 0.5], "values": [100, 800]}))
    jobs = [
        {"id": f"j{i}", "profile": "resnet", "samples": 20_000 * (1 + i), "min_batch": 32, "max_batch": 512, "max_gpus": 4, "arrival_s": 20 * i,
         "noise_scale": noise_ref if i % 2 == 0 else 300}
        for i in range(5)
    ]  # fmt: skip
    data = {"gpus": 6, "profiles": {"resnet": str(PROFILES / "h100_resnet50-cifar100.json")}, "noise_scales": {"shared": "shared.json"}, "jobs": jobs}
    path.write_text(yaml.safe_dump(data))
    return path


def test_three_variants_are_three_labelled_rows_and_the_summary_reruns_to_the_same_schedules(tmp_path):
    jobs = write_jobs(tmp_path / "jobs.yaml")
    args = ["simulate", str(jobs), "-p", "goodput_dp:p=-1", "-p", "goodput_dp:p=1", "-p", "elastic_dp"]
    flags = ["--no-react", "--interval", "60", "--start-cost", "30", "--in-place-cost", "30", "--no-plots", "-o", str(tmp_path / "a")]
    result = runner.invoke(app, [*args, *flags])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["goodput_dp:p=-1", "goodput_dp:p=1", "elastic_dp"]
    assert "decisions at ticks only" in result.output and "start 30 s" in result.output

    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["inputs"]["workload"]["sha256"] == hashlib.sha256(jobs.read_bytes()).hexdigest()
    assert summary["version"]["malleable"] and summary["settings"]["gpus"] == 6
    assert summary["settings"]["loop"]["react_to_events"] is False and summary["settings"]["cost"]["start_s"] == 30
    assert summary["fidelity"]["decisions"] == "at ticks only" and summary["fidelity"]["change_cost_s"] == 30
    runs = summary["policies"]
    assert runs["goodput_dp:p=-1"]["params"] == {"p": "-1"}
    effective = runs["goodput_dp:p=-1"]["effective_params"]
    assert effective["p"] == -1 and effective["remaining_exponent"] == 0.25 and effective["queue"] == "shortest"  # defaults spelled out
    assert runs["goodput_dp:p=1"]["effective_params"]["p"] == 1
    for label, run in runs.items():
        text = (tmp_path / "a" / run["schedule"]).read_text()
        assert hashlib.sha256(text.encode()).hexdigest() == run["schedule_sha256"], label

    again = runner.invoke(app, ["simulate", "--rerun", str(tmp_path / "a" / "summary.json"), "--no-plots", "-o", str(tmp_path / "b")])
    assert again.exit_code == 0, again.output
    assert "all 3 schedule(s) identical" in again.output
    for run in runs.values():
        assert (tmp_path / "b" / run["schedule"]).read_text() == (tmp_path / "a" / run["schedule"]).read_text()

    assert set(summary["inputs"]["referenced"]) == {"profiles.resnet", "noise_scales.shared"}
    (tmp_path / "shared.json").write_text(json.dumps({"fractions": [0, 0.5], "values": [100, 900]}))  # a file the jobs file names
    changed = runner.invoke(app, ["simulate", "--rerun", str(tmp_path / "a" / "summary.json"), "--no-plots", "-o", str(tmp_path / "c")])
    assert changed.exit_code == 2 and "inputs.referenced.noise_scales.shared.path=" in changed.output and "changed since the run" in changed.output
    assert len(changed.output.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
    jobs.write_text(jobs.read_text() + "\n")  # one byte more: not the file the run read
    changed = runner.invoke(app, ["simulate", "--rerun", str(tmp_path / "a" / "summary.json"), "--no-plots", "-o", str(tmp_path / "c")])
    assert changed.exit_code == 2 and "inputs.workload.path=" in changed.output and "changed since the run" in changed.output


def test_a_parameter_error_names_the_policy_and_the_parameter(tmp_path):
    jobs = write_jobs(tmp_path / "jobs.yaml")
    cases = [
        (["-p", "goodput_dp:p=minus1"], "goodput_dp.p='minus1': must be a number"),
        (["-p", "goodput_dp:pp=1"], "goodput_dp.pp: unknown parameter; goodput_dp takes"),
        (["-p", "goodput_dp:p"], "expected NAME:KEY=VALUE"),
        (["-p", "goodput_dp", "--param", "goodput_dp:remaining_exponent=lots"], "goodput_dp.remaining_exponent='lots': must be a number"),
        (["-p", "goodput_dp:strict_fifo=maybe"], "goodput_dp.strict_fifo='maybe': must be true or false"),
        (["-p", "goodput_dp:p=1", "-p", "goodput_dp:p=1"], "policy='goodput_dp:p=1': given twice"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["simulate", str(jobs), *args, "--no-plots", "-o", str(tmp_path / "out")])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_a_trajectory_named_once_reaches_its_jobs_and_two_sources_for_one_job_are_refused(tmp_path):
    jobs = write_jobs(tmp_path / "jobs.yaml")
    result = runner.invoke(app, ["simulate", str(jobs), "-p", "goodput_dp", "--no-plots", "-o", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    from flows.config.jobfile import load_jobs_file

    loaded = {j.id: j.noise_scale for j in load_jobs_file(jobs).jobs}
    assert loaded["j0"] is loaded["j2"] and loaded["j0"].values == (100.0, 800.0) and loaded["j1"].values == (300.0,)

    (tmp_path / "noise.json").write_text(json.dumps({"j1": 500}))
    clash = runner.invoke(app, ["simulate", str(jobs), "--noise", str(tmp_path / "noise.json"), "--no-plots", "-o", str(tmp_path / "b")])
    assert clash.exit_code == 2 and "--noise['j1']: job 'j1' already has its own noise_scale" in clash.output, clash.output
    missing = write_jobs(tmp_path / "other.yaml", noise_ref="sharde", noise_file=False)
    typo = runner.invoke(app, ["simulate", str(missing), "--no-plots", "-o", str(tmp_path / "c")])
    assert typo.exit_code == 2 and "noise_scale='sharde': no such entry in the file's noise_scales (known: shared)" in typo.output, typo.output
