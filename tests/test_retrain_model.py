"""Issue 35.5: `malleable retrain` logs the model with MLflow's pytorch flavour, a signature and an
input example, and registers a version under the name given. A real retrain (Dask workers, gloo),
MLflow on sqlite; the expected shapes come from the recipe's own dataset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_retrain_registers_a_model_version_with_a_signature(tmp_path, prefect_api_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLEABLE_", "MLFLOW_", "PREFECT_"))}
    # The session's Prefect API records the flow run: no ephemeral API of its own to start (~20 CPU s).
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=prefect_api_url, MALLEABLE_WORKERS="2", COLUMNS="250")
    done = subprocess.run(
        [sys.executable, "-m", "flows.commands.cli", "retrain", "elastic_tasks.examples:mlp_tiny", "--epochs", "0.25", "--model-name", "team-mlp"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=480,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "registered as version 1" in done.stdout, done.stdout

    import mlflow.pytorch
    from mlflow import MlflowClient
    from mlflow.models import get_model_info

    from elastic_tasks.examples import mlp_tiny

    uri = f"sqlite:///{tmp_path / '.malleable' / 'mlflow.db'}"
    client = MlflowClient(uri)
    [version] = client.search_model_versions("name = 'team-mlp'")
    run = client.get_run(version.run_id)
    assert int(version.version) == 1 and run.data.tags["malleable.mode"] == "retrain"
    mlflow.set_tracking_uri(uri)
    try:
        info = get_model_info("models:/team-mlp/1")
        x, y = mlp_tiny().dataset[0]
        [inputs] = info.signature.inputs.to_dict()
        assert list(inputs["tensor-spec"]["shape"])[1:] == list(x.shape)
        assert info.saved_input_example_info is not None
        model = mlflow.pytorch.load_model("models:/team-mlp/1")
        assert model(x.unsqueeze(0)).shape[0] == 1
    finally:
        mlflow.set_tracking_uri(None)
