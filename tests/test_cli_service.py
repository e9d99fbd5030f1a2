"""`malleable submit | jobs | cancel | wait` through the real CLI against a real sqlite store
(no service needed: submissions wait in the store)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.commands.cli import app
from service.store.records import JobState
from service.store import JobStore

runner = CliRunner()

PROFILE = {
    "workload": "mlp_tiny", "hardware": "test", "num_params": 6532, "batch_sizes": [8, 16, 32, 64],
    "iter_times_s": [0.004, 0.006, 0.010, 0.018], "max_batch_per_gpu": 64,
}  # fmt: skip


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k in list(__import__("os").environ):
        if k.startswith("MALLEABLE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("MALLEABLE_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "profile.json").write_text(json.dumps(PROFILE))

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    return invoke, JobStore(f"sqlite:///{(tmp_path / 'state' / 'jobs.db').resolve()}"), tmp_path


def test_submit_prints_the_job_id_and_the_store_holds_the_flags(cli):
    invoke, store, tmp = cli
    res = invoke("submit", "mlp_tiny", "--samples", "5000", "--min-batch", "16", "--max-batch", "64", "--max-gpus", "2", "--name", "exp", "--profile", str(tmp / "profile.json"))
    assert res.exit_code == 0, res.output
    job_id = res.output.strip().splitlines()[-1]
    row = store.job(job_id)
    assert (row.name, row.state, row.total_samples, row.spec["min_batch"], row.spec["max_batch"], row.spec["max_gpus"]) == ("exp", JobState.QUEUED, 5000, 16, 64, 2)
    # The same key again is the same job.
    again = invoke("submit", "mlp_tiny", "--samples", "5000", "--name", "exp", "--profile", str(tmp / "profile.json"), "--key", "k")
    twice = invoke("submit", "mlp_tiny", "--samples", "5000", "--name", "exp", "--profile", str(tmp / "profile.json"), "--key", "k")
    assert again.output.split()[-1] == twice.output.split()[0] and "already submitted" in twice.output
    assert len(store.jobs()) == 2


def test_epochs_are_turned_into_samples(cli):
    invoke, store, tmp = cli
    res = invoke("submit", "mlp_tiny", "--epochs", "2.5", "--dataset-samples", "1000", "--profile", str(tmp / "profile.json"))
    assert res.exit_code == 0, res.output
    assert store.jobs()[0].total_samples == 2500


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("submit", "mlp_tiny", "--samples", "100", "--min-batch", "64", "--max-batch", "16"), "min_batch=64: is greater than max_batch=16"),
        (("submit", "mlp_tiny"), "give --samples or --epochs"),
        (("submit",), "give an ENTRYPOINT or --file JOBS"),
        (("submit", "mlp_tiny", "--samples", "100", "--max-gpus", "0"), "max_gpus=0"),
        (("submit", "not an entry", "--samples", "100"), "ENTRYPOINT='not an entry'"),
        (("submit", "--file", "missing.yaml"), "no such file"),
        (("cancel", "jnope"), "JOB_ID='jnope'"),
        (("wait", "jnope"), "JOB_ID='jnope'"),
        (("wait", "jnope", "--timeout", "-1"), "--timeout=-1.0"),
        (("jobs", "--format", "xml"), "--format='xml'"),
    ],
)
def test_bad_input_is_exit_2_and_one_line_naming_it_and_stores_nothing(cli, args, message):
    invoke, store, tmp = cli
    full = list(args)
    if args[0] == "submit" and len(args) > 1 and args[1] != "--file":
        full += ["--profile", str(tmp / "profile.json")]
    res = invoke(*full)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert len([line for line in res.output.splitlines() if line.strip()]) == 1
    assert store.jobs() == []


def test_jobs_lists_cancel_ends_a_queued_job_and_wait_reports_it_as_not_finished(cli):
    invoke, store, tmp = cli
    ids = [invoke("submit", "mlp_tiny", "--samples", "1000", "--name", n, "--profile", str(tmp / "profile.json")).output.split()[-1] for n in ("a", "b")]
    listing = json.loads(invoke("jobs", "--format", "json").output)
    assert [(j["id"], j["name"], j["state"]) for j in listing] == [(ids[0], "a", "queued"), (ids[1], "b", "queued")]
    res = invoke("cancel", ids[0])
    assert res.exit_code == 0 and "cancelled" in res.output
    table = invoke("jobs").output
    assert ids[1] in table and ids[0] not in table  # finished jobs only with --all
    assert ids[0] in invoke("jobs", "--all").output
    waited = invoke("wait", ids[0])
    assert waited.exit_code == 1 and "cancelled" in waited.output


def test_jobs_shows_each_generations_predicted_and_measured_samples_per_second(cli):
    from service.store.records import AllocationRow

    invoke, store, tmp = cli
    job = invoke("submit", "mlp_tiny", "--samples", "1000", "--name", "g", "--profile", str(tmp / "profile.json")).output.split()[-1]
    store.record_allocations([AllocationRow(job, 1000.0, 2, 256, "start", predicted_samples_per_s=1234.0)])
    store.record_measured_rate(job, 777.0)
    store.record_allocations([AllocationRow(job, 1060.0, 2, 36, "batch", predicted_samples_per_s=1500.0)])
    out = invoke("jobs", "--generations").output
    assert "predicted samples/s" in out and "1,234" in out and "777" in out and "1,500" in out
    [listed] = json.loads(invoke("jobs", "--format", "json").output)
    assert [(g["gpus"], g["batch"], g["predicted_samples_per_s"], g["measured_samples_per_s"]) for g in listed["generations"]] == [
        (2, 256, 1234.0, 777.0),
        (2, 36, 1500.0, None),  # the generation running now: not measured yet
    ]
