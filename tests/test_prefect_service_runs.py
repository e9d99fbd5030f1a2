"""Service runs are first-class runs, on real servers: a `prefect server`, a process worker, a
running `malleable serve` (its own Dask cluster, gloo training) on a sqlite job store, MLflow.

``cluster-run`` deployed and run twice through the live service:
* a jobs file with a job whose recipe raises → the flow run ends FAILED, and its summary artifact
  names the failed job and the error;
* a jobs file of good jobs → COMPLETED with its artifacts, an MLflow parent run whose nested job
  runs are the service's (final_*, jct_s, tags of `malleable run`'s runs), summary metrics that
  match the store (oracle: JCT and makespan from the store's own timestamps);
then `malleable compare --last 2` puts the two service runs side by side, and `--submitter`
selects the service's job runs and says what it found.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from service.store import JobStore
from tests.recipe_sources import failing_forward_recipe
from tests.ports import unclaimed_port
from tests.test_prefect_deploy import BIN, ROOT, _prefect, _stop, _wait_healthy
from tests.service_process import PROFILE, ServiceProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

JOB = {"profile": "p", "min_batch": 32, "max_batch": 128, "max_gpus": 2}
FAILING = {"profiles": {"p": PROFILE}, "jobs": [
    {"id": "good", "workload": "mlp_tiny", "samples": 2048, **JOB},
    {"id": "bad", "workload": "brokenrecipe:recipe", "samples": 2048, **JOB},
]}  # fmt: skip
PASSING = {"profiles": {"p": PROFILE}, "jobs": [
    {"id": "long", "workload": "mlp_tiny", "samples": 12_288, **JOB},
    {"id": "short", "workload": "mlp_tiny", "samples": 4096, "arrival_s": 1, **JOB},
]}  # fmt: skip

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _deployment_run(env: dict[str, str], jobs: Path) -> tuple[str, str]:
    """(final state, flow run id) of one `cluster-run` deployment run, watched to the end. Made and
    watched through the server's REST API, as `prefect deployment run --watch` does (that command
    itself is tests/test_prefect_deploy.py's): no CLI process importing prefect for each run."""
    deployment = _api(env, "/deployments/name/cluster/cluster-run")["id"]
    flow_run = _api(env, f"/deployments/{deployment}/create_flow_run", {"parameters": {"jobs_file": str(jobs), "interval_s": 2}})["id"]
    deadline = time.monotonic() + 900  # a hang bound
    while (state := _api(env, f"/flow_runs/{flow_run}")["state"]["type"]) not in TERMINAL and time.monotonic() < deadline:
        time.sleep(1)
    return state, flow_run


def _api(env: dict[str, str], path: str, body: dict | None = None):  # noqa: ANN202 - the server's JSON
    """The Prefect server's REST API (what its client calls), read here without importing prefect
    in a process of its own for each question (seconds of start-up each)."""
    request = urllib.request.Request(
        env["PREFECT_API_URL"] + path, data=None if body is None else json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    # A busy server answers 503 (its database timed out: seen under load) or 429/502; Prefect's own
    # client retries those with a back-off, so the questions asked here do too, a bounded number of times.
    for attempt in range(6):
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            if exc.code not in (429, 502, 503) or attempt == 5:
                raise
            time.sleep(min(2**attempt, 10))


def _artifacts(env: dict[str, str], flow_run: str) -> dict[str, str]:
    found = _api(env, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run]}}})
    return {a["key"]: a["data"] if isinstance(a["data"], str) else json.dumps(a["data"]) for a in found if a["key"]}


def test_cluster_run_through_a_live_service_fails_on_a_failed_job_and_is_comparable_when_not(tmp_path, migrated_prefect_home):
    import yaml

    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "brokenrecipe.py").write_text(failing_forward_recipe("broken", "boom in the user's forward"))
    (tmp_path / "failing.yaml").write_text(yaml.safe_dump(FAILING))
    (tmp_path / "passing.yaml").write_text(yaml.safe_dump(PASSING))
    state, store_url = tmp_path / "state", f"sqlite:///{tmp_path / 'jobs.db'}"
    port = unclaimed_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MALLEABLE_", "MLFLOW_"))}
    env.update(
        PREFECT_HOME=str(migrated_prefect_home(tmp_path / "prefect-home")), PREFECT_API_URL=api, PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_API_PORT=str(port), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", COLUMNS="250",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path / "recipes")]),
    )  # fmt: skip
    # The service and the Prefect worker share the team's store and MLflow (here a state directory).
    team = dict(env, MALLEABLE_JOB_STORE=store_url, MALLEABLE_STATE_DIR=str(state), MALLEABLE_WORKERS="2", MALLEABLE_EXPERIMENT="team", MALLEABLE_INTERVAL_S="2")
    server = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path, env=env, stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    service = worker = None
    try:
        # The service needs no Prefect: it starts (its cluster, torch on its workers) while the
        # server does. Hang checks, generous for a loaded 2-core machine: each start imports torch, prefect, mlflow.
        service = ServiceProcess(tmp_path, team)
        _wait_healthy(api, server, limit_s=600)
        _prefect(env, "work-pool", "create", "malleable-process", "--type", "process")
        worker = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", "malleable-process", "--type", "process", "--limit", "1"],
            # Asks for scheduled runs every 2 s (default 10 s): a run starts soon after it is made.
            # Started before the deploy, so that its start-up (importing prefect) overlaps it.
            cwd=tmp_path, env=dict(team, MALLEABLE_HOME=str(ROOT), PREFECT_WORKER_QUERY_SECONDS="2"), stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        _prefect(env, "deploy", "--name", "cluster-run", timeout=600)
        service.wait_for_line("serving", timeout=600)

        failed_state, failed_run = _deployment_run(env, tmp_path / "failing.yaml")
        log = (tmp_path / "worker.log").read_text()
        assert failed_state == "FAILED", f"{failed_state}\n--- worker ---\n{log[-4000:]}\n--- service ---\n{service.output()[-3000:]}"
        summary = _artifacts(env, failed_run)["cluster-summary"]
        assert "job bad failed" in summary and "boom in the user's forward" in summary, summary
        assert "| good | finished |" in summary, summary

        passed_state, passed_run = _deployment_run(env, tmp_path / "passing.yaml")
        log = (tmp_path / "worker.log").read_text()
        assert passed_state == "COMPLETED", f"{passed_state}\n--- worker ---\n{log[-4000:]}\n--- service ---\n{service.output()[-3000:]}"
        assert {"cluster-schedule", "cluster-results", "cluster-summary"} <= set(_artifacts(env, passed_run))
    finally:
        if worker is not None:
            _stop(worker)
        if service is not None:
            service.kill_tree()
        _stop(server)

    # MLflow: one parent run per flow run, the service's job runs nested under it.
    mlflow = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    exp = mlflow.get_experiment_by_name("team")
    tagged = mlflow.search_runs([exp.experiment_id], "tags.`malleable.mode` = 'service'")
    parents = [p for p in tagged if "mlflow.parentRunId" not in p.data.tags and "malleable.kind" not in p.data.tags]
    by_status = {p.info.status: p for p in parents}
    assert set(by_status) == {"FAILED", "FINISHED"}, [(p.info.run_name, p.info.status) for p in parents]
    ok = by_status["FINISHED"]
    children = mlflow.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{ok.info.run_id}'")
    assert sorted(c.data.tags["malleable.name"] for c in children) == ["long", "short"]
    store = JobStore(store_url, create=False)
    rows = {r.name: r for r in store.jobs() if r.submitter == "cluster-flow:passing.yaml"}
    for child in children:
        row = rows[child.data.tags["malleable.name"]]
        tags, metrics = child.data.tags, child.data.metrics
        assert tags["malleable.mode"] == "service" and tags["malleable.policy"] == "elastic_dp" and child.info.status == "FINISHED"
        assert metrics["jct_s"] == pytest.approx(row.finished_at - row.submitted_at, abs=1e-3)
        assert metrics["final_steps"] == row.steps and metrics["final_loss"] == pytest.approx(row.final_loss)
        assert metrics["final_samples_seen"] >= row.total_samples and metrics["gpu_seconds"] > 0
    makespan = max(r.finished_at for r in rows.values()) - min(r.submitted_at for r in rows.values())
    assert ok.data.metrics["makespan_s"] == pytest.approx(makespan, abs=1e-3)
    assert ok.data.metrics["jobs_completed"] == 2 and 0 < ok.data.metrics["gpu_utilisation"] <= 1
    assert ok.data.metrics["avg_jct_s"] == pytest.approx(sum(r.finished_at - r.submitted_at for r in rows.values()) / 2, abs=1e-3)
    history = {r.name: [(round(a.time - r.submitted_at, 2), a.gpus, a.kind) for a in store.allocations(r.id)] + [("end", round(r.finished_at - r.submitted_at, 2))] for r in rows.values()}
    assert ok.data.params["capacity"] == "2", (history, service.output()[-3000:])

    look = dict(env, MALLEABLE_STATE_DIR=str(state), MALLEABLE_EXPERIMENT="team")
    cli = [sys.executable, "-m", "flows.commands.cli", "compare"]
    # The two questions are independent reads: asked side by side.
    last = subprocess.Popen([*cli, "--last", "2", "--out", str(tmp_path / "last.png")], cwd=tmp_path, env=look, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    picked = subprocess.Popen(
        [*cli, "--submitter", "cluster-flow:passing.yaml", "--out", str(tmp_path / "picked.png")], cwd=tmp_path, env=look, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    last_out, last_err = last.communicate(timeout=300)
    picked_out, picked_err = picked.communicate(timeout=300)
    assert last.returncode == 0, last_out + last_err
    assert "cluster-failing-service" in last_out and "cluster-passing-service" in last_out, last_out
    assert picked.returncode == 0, picked_out + picked_err
    assert "jobs of cluster-flow:passing.yaml: 2 service job run(s) in experiment 'team' (2 finished)" in picked_out, picked_out
