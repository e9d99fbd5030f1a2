"""The service's MLflow tracking on its own thread: calls made before MLflow is even imported are
all sent, in order; a new job run's id reaches ``on_run``; a resumed run's id is known at once;
a URI MLflow cannot use at all turns tracking off with one warning. Real MLflow on a sqlite file."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from service.tracking import ServiceTracking


def test_calls_made_while_mlflow_starts_are_all_sent_in_order(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    recorded: list[tuple[str, str]] = []
    warnings: list[str] = []
    tracking = ServiceTracking(uri, "exp", warn=warnings.append, job_tags={"malleable.policy": "p"}, on_run=lambda j, r: recorded.append((j, r)))
    assert tracking.enabled
    tracking.service_started({"policy": "p"})
    assert tracking.job_run("j1", "one", None, {"samples": 10}, submitter="alice") is None  # made later, on the MLflow thread
    for step, loss in enumerate((3.0, 2.0, 1.5)):
        tracking.metrics("j1", {"loss": loss, "never": None}, step=step)
    tracking.metrics(None, {"gpus_alive": 2.0})
    tracking.job_final("j1", {"final_loss": 1.5}, 1234)
    tracking.job_ended("j1", "FINISHED")
    tracking.close()
    assert warnings == []
    assert [j for j, _ in recorded] == ["j1"]
    run_id = recorded[0][1]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["samples"] == "10"
    assert run.data.tags["malleable.submitter"] == "alice" and run.data.tags["malleable.policy"] == "p" and run.data.tags["malleable.job_id"] == "j1"
    assert [m.value for m in sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)] == [3.0, 2.0, 1.5]
    assert "never" not in run.data.metrics and run.data.metrics["final_loss"] == 1.5
    service_runs = [r for r in client.search_runs([run.info.experiment_id]) if r.data.tags.get("malleable.kind") == "service"]
    assert len(service_runs) == 1 and service_runs[0].data.metrics["gpus_alive"] == 2.0 and service_runs[0].info.status == "FINISHED"


def test_a_resumed_job_keeps_its_run_and_close_ends_runs_left_open(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    earlier = client.create_run(client.create_experiment("exp")).info.run_id
    client.set_terminated(earlier, status="KILLED")
    recorded: list[tuple[str, str]] = []
    tracking = ServiceTracking(uri, "exp", warn=lambda _l: None, on_run=lambda j, r: recorded.append((j, r)))
    assert tracking.job_run("j1", "one", earlier, {}) == earlier
    tracking.metrics("j1", {"loss": 0.5})
    tracking.close()
    assert recorded == []  # no new run
    run = client.get_run(earlier)
    assert run.info.status == "KILLED" and run.data.metrics["loss"] == 0.5  # ended by close: the service stopped under it


def test_a_uri_mlflow_cannot_use_at_all_turns_tracking_off_with_one_warning(tmp_path):
    """Not a store that is away (those calls are journaled: test_service_tracking_replay.py) but
    one no MLflow could ever reach: nothing to wait for."""
    warnings: list[str] = []
    tracking = ServiceTracking("nosuchscheme://x", "exp", warn=warnings.append, journal=tmp_path / "journal.jsonl")
    tracking.service_started({})
    tracking.job_run("j1", "one", None, {})
    tracking.metrics("j1", {"loss": 1.0})
    tracking.close()
    assert len(warnings) == 1 and warnings[0].startswith("MLflow tracking is off for this service"), warnings
    assert not tracking.enabled and tracking.job_run("j2", "two", "r", {}) is None
    assert not (tmp_path / "journal.jsonl").exists()


def test_no_tracking_uri_means_no_thread_and_nothing_to_wait_for():
    tracking = ServiceTracking(None)
    assert not tracking.enabled and tracking.job_run("j", "n", None, {}) is None
    tracking.metrics("j", {"loss": 1.0})
    tracking.close()


def test_a_backlog_beyond_its_bound_waits_on_disk_and_still_arrives_whole_in_order(tmp_path):
    """Calls made faster than MLflow takes them (here: all before MLflow has even opened its
    store) go to the journal past ``MAX_PENDING`` rather than memory; none is dropped."""

    class Small(ServiceTracking):
        MAX_PENDING = 5

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    recorded: list[tuple[str, str]] = []
    tracking = Small(uri, "exp", warn=lambda _line: None, on_run=lambda j, r: recorded.append((j, r)), journal=tmp_path / "journal.jsonl")
    tracking.job_run("j1", "one", None, {})
    values = [float(v) for v in range(50)]
    for step, value in enumerate(values):
        tracking.metrics("j1", {"loss": value}, step=step)
    tracking.job_ended("j1", "FINISHED")
    tracking.close()
    history = MlflowClient(uri).get_metric_history(recorded[0][1], "loss")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == values
    assert MlflowClient(uri).get_run(recorded[0][1]).info.status == "FINISHED" and not (tmp_path / "journal.jsonl").exists()
