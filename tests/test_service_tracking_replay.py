"""The service's MLflow tracking while the tracking store is away: every call is journaled in
order and replayed when the store is back — by the same service, or by the next one on the job
store — so a job's run, parameters, metrics and end all arrive; nothing waits on MLflow.

Real MLflow on a sqlite file, real job store. The store is taken away by putting a plain file
where its directory was (sqlite can neither open nor write it, whoever runs the tests, root
included) and given back by putting the directory back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from mlflow.tracking import MlflowClient

from allocator.allocation import Allocation, Share
from allocator.loop.lifecycle import JobState
from allocator.loop.types import JobTransition, StepReport
from allocator.types import RescaleEvent, RescaleKind
from service.client import ServiceClient
from service.recorder import StoreRecorder
from service.store import JobStore
from service.tracking import ServiceTracking, service_journal
from tests.service_helpers import job_entry


def _take_away(store_dir: Path) -> Path:
    aside = store_dir.with_name(store_dir.name + ".aside")
    if store_dir.exists():
        store_dir.rename(aside)
    store_dir.write_text("not a directory")
    return aside


def _give_back(store_dir: Path, aside: Path) -> None:
    store_dir.unlink()
    if aside.exists():
        aside.rename(store_dir)


def _wait_for(what: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Poll until ``what()`` holds (the MLflow thread works on its own time); a hang fails."""
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "the MLflow thread never got there"
        time.sleep(0.05)


def _journaled_losses(journal: Path) -> list[float]:
    """The ``loss`` values waiting in the journal, in journal order (read with json, not the product)."""
    if not journal.exists():
        return []
    values = []
    for line in journal.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        values += [m[1] for m in record.get("metrics", []) if m[0] == "loss"]
    return values


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_a_job_recorded_while_the_store_is_away_reaches_it_whole_and_in_order(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    job = ServiceClient(store, submitter="alice").submit(job_entry("a", 4000)).job_id
    store_dir, journal = tmp_path / "mlflow", tmp_path / "journal.jsonl"
    uri = f"sqlite:///{store_dir / 'mlflow.db'}"
    aside = _take_away(store_dir)
    warnings: list[str] = []
    tracking = ServiceTracking(
        uri, "exp", warn=warnings.append, job_tags={"malleable.policy": "p"}, journal=journal, retry_every_s=0.2,
        on_run=lambda job_id, run_id: store.update_job(job_id, mlflow_run_id=run_id),
    )  # fmt: skip
    recorder = StoreRecorder(store, tracking, lambda j: str(tmp_path / "ckpt" / j), lambda _j: None, say=lambda _line: None)
    tracking.service_started({"policy": "p"})
    recorder.on_job(JobTransition(0.0, job, JobState.RUNNING))
    shares = [Share(1, 32), Share(2, 64)]
    for i, share in enumerate(shares):
        event = RescaleEvent(float(i), job, shares[i - 1] if i else None, share, RescaleKind.IN_PLACE if i else RescaleKind.START)
        recorder.observer(StepReport(float(i), Allocation.of({job: share}), (event,), (), (), 0, 0, 1))
    for step, loss in enumerate((3.0, 2.0)):
        tracking.metrics(job, {"loss": loss}, step=step)
    _wait_for(lambda: _journaled_losses(journal) == [3.0, 2.0])
    assert store.job(job).mlflow_run_id is None  # nothing reached MLflow, and the loop went on

    _give_back(store_dir, aside)
    tracking.metrics(job, {"loss": 1.5}, step=2)
    recorder.on_job(JobTransition(2.0, job, JobState.FINISHED))
    tracking.close()

    row = store.job(job)
    assert row.mlflow_run_id is not None and not journal.exists()
    client = MlflowClient(uri)
    run = client.get_run(row.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {k: str(v)[:500] for k, v in {**row.spec, "submitter": "alice"}.items()}
    assert run.data.tags["malleable.job_id"] == job and run.data.tags["malleable.policy"] == "p"
    assert _history(client, run.info.run_id, "loss") == [(0, 3.0), (1, 2.0), (2, 1.5)]
    gpus = sorted(client.get_metric_history(run.info.run_id, "gpus"), key=lambda m: m.timestamp)
    assert [m.value for m in gpus] == [1.0, 2.0]  # in the order the loop logged them
    assert "gpu_seconds" in run.data.metrics and "rescales" in run.data.metrics  # the end values, logged as it finished
    service_runs = [r for r in client.search_runs([run.info.experiment_id]) if r.data.tags.get("malleable.kind") == "service"]
    assert len(service_runs) == 1 and service_runs[0].data.params == {"policy": "p"} and service_runs[0].info.status == "FINISHED"
    assert [m.value for m in sorted(client.get_metric_history(service_runs[0].info.run_id, "gpus_in_use"), key=lambda m: m.timestamp)] == [1.0, 2.0]
    told = [w for w in warnings if "buffered in" in w]
    assert len(told) == 1 and str(journal) in told[0], warnings  # said once, not per call
    assert any("reachable again" in w for w in warnings) and not any(w.startswith("MLflow tracking is off") for w in warnings)


def test_a_store_lost_mid_run_loses_nothing_and_a_refused_call_holds_nothing_up(tmp_path):
    store_dir, journal = tmp_path / "mlflow", tmp_path / "journal.jsonl"
    uri = f"sqlite:///{store_dir / 'mlflow.db'}"
    recorded: list[tuple[str, str]] = []
    warnings: list[str] = []
    tracking = ServiceTracking(uri, "exp", warn=warnings.append, on_run=lambda j, r: recorded.append((j, r)), journal=journal, retry_every_s=0.2)
    tracking.job_run("j1", "one", None, {"samples": 10})
    tracking.metrics("j1", {"loss": 3.0}, step=0)
    _wait_for(lambda: bool(recorded) and bool(_history(MlflowClient(uri), recorded[0][1], "loss")))  # in MLflow
    aside = _take_away(store_dir)
    tracking.metrics("j1", {"loss": 2.0}, step=1)
    tracking.metrics("j1", {"no?such:name": 1.0}, step=1)  # MLflow refuses this name: dropped when replayed
    tracking.job_ended("j1", "KILLED")
    tracking.job_run("j2", "two", None, {"samples": 20})
    tracking.metrics("j2", {"loss": 9.0}, step=0)
    tracking.job_ended("j2", "KILLED")  # suspended ...
    tracking.job_run("j2", "two", None, {"samples": 20})  # ... and resumed before its run's id reached the store
    tracking.metrics("j2", {"loss": 8.0}, step=1)
    _wait_for(lambda: _journaled_losses(journal) == [2.0, 9.0, 8.0])
    _give_back(store_dir, aside)
    tracking.job_ended("j2", "FINISHED")
    tracking.close()

    client = MlflowClient(uri)
    assert [j for j, _ in recorded] == ["j1", "j2"] and not journal.exists()
    runs = {j: client.get_run(r) for j, r in recorded}
    assert _history(client, recorded[0][1], "loss") == [(0, 3.0), (1, 2.0)] and runs["j1"].info.status == "KILLED"
    assert _history(client, recorded[1][1], "loss") == [(0, 9.0), (1, 8.0)] and runs["j2"].info.status == "FINISHED"
    experiment = runs["j1"].info.experiment_id
    assert len(client.search_runs([experiment], "tags.`malleable.job_id` = 'j2'")) == 1  # one run, continued
    refused = [w for w in warnings if w.startswith("MLflow refused")]
    assert len(refused) == 1 and "no?such:name" not in runs["j1"].data.metrics


def test_what_a_stopping_service_could_not_send_the_next_one_on_its_store_sends(tmp_path):
    store_dir = tmp_path / "mlflow"
    uri = f"sqlite:///{store_dir / 'mlflow.db'}"
    journal = service_journal(f"sqlite:///{tmp_path / 'state' / 'jobs.db'}")
    assert journal == tmp_path / "state" / "mlflow-service-buffer.jsonl"  # beside the job store
    aside = _take_away(store_dir)
    first_said: list[str] = []
    first = ServiceTracking(uri, "exp", warn=first_said.append, journal=journal, retry_every_s=0.2)
    first.service_started({"policy": "p"})
    first.job_run("j1", "one", None, {"samples": 5})
    first.metrics("j1", {"loss": 1.0}, step=0)
    first.job_ended("j1", "FINISHED")
    first.close()
    assert journal.stat().st_size > 0 and any("the next service on this job store sends them" in w for w in first_said), first_said

    _give_back(store_dir, aside)
    recorded: list[tuple[str, str]] = []
    second = ServiceTracking(uri, "exp", warn=lambda _line: None, on_run=lambda j, r: recorded.append((j, r)), journal=journal, retry_every_s=0.2)
    second.close()
    assert [j for j, _ in recorded] == ["j1"] and not journal.exists()
    run = MlflowClient(uri).get_run(recorded[0][1])
    assert run.info.status == "FINISHED" and run.data.params == {"samples": "5"} and run.data.metrics == {"loss": 1.0}


def test_journals_of_stores_elsewhere_are_apart_and_stable():
    a, b = service_journal("postgresql://u@db1/jobs"), service_journal("postgresql://u@db2/jobs")
    assert a != b and a == service_journal("postgresql://u@db1/jobs") and "u@db1" not in str(a)
