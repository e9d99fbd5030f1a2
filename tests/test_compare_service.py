"""`malleable compare` on runs of a service (real MLflow, sqlite): `--last` counts runs, never job
runs; `--submitter`, `--jobs` and a time window select service job runs, one column each, and
the command says what it found. The figures are checked against values computed here."""

from __future__ import annotations

import time

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric
from typer.testing import CliRunner

from flows.commands.cli import app
from service.tracking import ensure_experiment


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A service run (gpus_alive 4) and three of its job runs: two of alice's, one of bob's, plus a
    flow's parent run over bob's job, as the service and the cluster flow write them."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MALLEABLE_EXPERIMENT", "team")
    (tmp_path / "state").mkdir()
    client = MlflowClient(f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}")
    exp = ensure_experiment(client, "team")
    now = int(time.time() * 1000)
    service = client.create_run(exp, run_name="service-1", start_time=now - 600_000, tags={"malleable.kind": "service"})
    client.log_batch(service.info.run_id, metrics=[Metric("gpus_alive", 4, now - 500_000, 0), Metric("gpus_alive", 4, now - 100_000, 1)])
    parent = client.create_run(exp, run_name="cluster-jobs-service", start_time=now - 400_000, tags={"malleable.mode": "service", "malleable.policy": "service"})
    client.log_batch(parent.info.run_id, metrics=[Metric("makespan_s", 50.0, now, 0), Metric("avg_jct_s", 50.0, now, 0), Metric("gpu_utilisation", 0.5, now, 0)])
    client.set_terminated(parent.info.run_id, "FINISHED")

    def job(name: str, submitter: str, submitted_ago_s: float, queue_s: float, jct_s: float, gpu_s: float, parent_id: str | None = None) -> None:
        tags = {"malleable.kind": "service-job", "malleable.mode": "service", "malleable.policy": "elastic_dp", "malleable.submitter": submitter,
                "malleable.job_id": f"j-{name}", "malleable.name": name}  # fmt: skip
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        start = now - int((submitted_ago_s - queue_s) * 1000)
        run = client.create_run(exp, run_name=f"{name}-j-{name}", start_time=start, tags=tags)
        client.log_param(run.info.run_id, "workload", "elastic_tasks.examples:mlp_tiny")
        values = {"jct_s": jct_s, "queue_delay_s": queue_s, "gpu_seconds": gpu_s, "rescales": 1.0}
        client.log_batch(run.info.run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()])
        client.set_terminated(run.info.run_id, "FINISHED", end_time=start + int((jct_s - queue_s) * 1000))

    job("a1", "alice@lab", submitted_ago_s=300, queue_s=0, jct_s=100, gpu_s=200)
    job("a2", "alice@lab", submitted_ago_s=250, queue_s=10, jct_s=150, gpu_s=100)  # ends 100 s ago
    job("b1", "bob@lab", submitted_ago_s=200, queue_s=0, jct_s=50, gpu_s=50, parent_id=parent.info.run_id)
    return tmp_path


def test_last_counts_runs_never_job_runs(recorded):
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["compare", "--last", "5", "--out", str(recorded / "last.png")])
    assert result.exit_code == 0, result.output
    assert "cluster-jobs-service" in result.output
    assert "a1" not in result.output.split("plot written")[0].split("\n", 1)[0]  # job runs are no columns
    assert "service-1" not in result.output


def test_a_submitters_jobs_are_one_column_with_figures_from_their_runs(recorded):
    png = recorded / "alice.png"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["compare", "--submitter", "alice@lab", "--submitter", "bob@lab", "--out", str(png)])
    assert result.exit_code == 0, result.output
    assert "jobs of alice@lab: 2 service job run(s) in experiment 'team' (2 finished)" in result.output
    assert "jobs of bob@lab: 1 service job run(s) in experiment 'team' (1 finished)" in result.output
    # alice: submitted 300 and 250 s ago, ended 200 and 100 s ago -> makespan 200 s; JCTs 100, 150 -> mean 125;
    # 300 GPU-seconds of a 4-GPU service over 200 s -> 37.5 %.
    from flows.recording.comparison import compare_runs
    from flows.recording.service_selection import Selection

    [alice] = compare_runs([], 2, png, [Selection("alice", submitter="alice@lab")]).runs
    assert alice.value("makespan_s") == pytest.approx(200, abs=0.01) and alice.value("avg_jct_s") == pytest.approx(125)
    assert alice.value("gpu_utilisation") == pytest.approx(300 / (4 * 200), abs=1e-4) and alice.capacity == "4"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_jobs_and_a_time_window_select_and_nothing_found_is_one_line(recorded):
    runner = CliRunner(env={"COLUMNS": "200"})
    picked = runner.invoke(app, ["compare", "--jobs", "a2,b1", "--out", str(recorded / "j.png")])
    assert picked.exit_code == 0 and "jobs a2,b1: 2 service job run(s)" in picked.output, picked.output
    window = runner.invoke(app, ["compare", "--since", "270s", "--out", str(recorded / "w.png")])
    assert window.exit_code == 0 and "service jobs since 270s: 2 service job run(s)" in window.output, window.output  # a2 and b1
    none = runner.invoke(app, ["compare", "--submitter", "carol@lab", "--out", str(recorded / "n.png")])
    assert none.exit_code == 1 and none.output.count("\n") == 1 and "carol@lab" in none.output, none.output
    bad = runner.invoke(app, ["compare", "--since", "yesterday-ish", "--out", str(recorded / "b.png")])
    assert bad.exit_code == 2 and "--since='yesterday-ish'" in bad.output and "Traceback" not in bad.output


def test_a_plain_name_selects_its_submitters_jobs(recorded):
    """Issue 35.8: `--submitter alice` finds what `malleable jobs` shows as "alice@lab" (sqlite) or
    "alice (alice@laptop)" (PostgreSQL's role first), and nobody else's."""
    from flows.recording.service_selection import submitter_matches

    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["compare", "--submitter", "alice", "--out", str(recorded / "plain.png")])
    assert result.exit_code == 0, result.output
    assert "jobs of alice: 2 service job run(s)" in result.output
    assert submitter_matches("alice (alice@laptop)", "alice") and submitter_matches("alice@lab", "alice")
    assert not submitter_matches("alicia@lab", "alice") and not submitter_matches("bob (alice@laptop)", "alice")
    assert not submitter_matches("alice (x@y)", "alice (other@y)")
