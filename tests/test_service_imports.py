"""What a `malleable serve` process loads: no torch (the ranks import it on the workers), so a
service that restarts after a crash is serving again without seconds of imports (issue 28)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from elastic_tasks.workloads import EXAMPLE_NAMES, resolve_workload

ROOT = Path(__file__).resolve().parents[1]
# What `serve` imports on the way to serving an adopted cluster, and what it submits ranks with.
SERVE_MODULES = ("flows.commands.service", "service.runner", "deploy.clusters", "flows.config.kube", "elastic_tasks.rank.task", "elastic_tasks.executor")


def test_the_modules_a_service_runs_on_import_no_torch():
    probe = "import importlib, json, sys\n" f"for m in {SERVE_MODULES!r}:\n    importlib.import_module(m)\n" "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "torch" not in loaded


def test_the_example_names_the_service_resolves_are_the_examples():
    from elastic_tasks.examples import EXAMPLES

    assert EXAMPLE_NAMES == set(EXAMPLES)
    assert resolve_workload("mlp_tiny") == "elastic_tasks.examples:mlp_tiny"
    assert resolve_workload("pkg.mod:fn") == "pkg.mod:fn"
    with pytest.raises(ValueError, match=r"workload='nope'"):
        resolve_workload("nope", "j")


@pytest.mark.slow
def test_a_recipe_that_fails_to_build_fails_its_job_from_the_ranks_and_the_service_goes_on(tmp_path):
    """The service no longer builds recipes itself: a module that imports but returns no recipe
    fails that job (its error names the entry point), and the next job still finishes."""
    from deploy.clusters import connect
    from service.client import ServiceClient
    from service.store.records import JobState
    from service.runner import Service, ServiceConfig
    from tests.service_helpers import job_entry

    config = ServiceConfig(store_url=f"sqlite:///{tmp_path / 'jobs.db'}", checkpoint_root=str(tmp_path / "ckpt"), interval_s=60.0, poll_s=0.2, checkpoint_every=100)
    service = Service(config, say=lambda _line: None)
    service.acquire()
    with connect("local", workers=2) as dask:
        thread = threading.Thread(target=service.run, args=(dask,), kwargs={"cluster_owned": False}, daemon=True)
        thread.start()
        try:
            client = ServiceClient(service.store, submitter="t")
            # Importable (the feed admits it), but it returns a dict, not a TrainingRecipe.
            bad = client.submit(job_entry("bad", 2000, workload="tests.service_helpers:job_entry", max_gpus=1)).job_id
            good = client.submit(job_entry("good", 2000, max_gpus=1)).job_id
            rows = {r.id: r for r in client.wait([bad, good], timeout_s=300, poll_s=0.2)}
        finally:
            service.stop()
            thread.join(timeout=120)
    assert rows[bad].state is JobState.FAILED
    assert "tests.service_helpers:job_entry" in rows[bad].error and "TrainingRecipe" in rows[bad].error
    assert rows[good].state is JobState.FINISHED
