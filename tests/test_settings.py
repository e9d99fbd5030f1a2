"""Settings: one place, MALLEABLE_ prefix, defaults that need no server, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from allocator.admission import OverflowMode
from flows.config.settings import ClusterKind, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no stray .env file
    import os

    for key in list(os.environ):
        if key.startswith("MALLEABLE_"):
            monkeypatch.delenv(key)


def test_defaults_need_no_server():
    s = load_settings()
    assert s.cluster is ClusterKind.LOCAL
    assert s.workers == 4 and s.policy == "elastic_dp" and s.overflow is OverflowMode.QUEUE
    assert s.resolved_tracking_uri == f"sqlite:///{(Path('.malleable') / 'mlflow.db').resolve()}"
    assert s.resolved_checkpoint_dir == Path(".malleable") / "checkpoints"
    # The default policy skips the validator's check (start-up cost): it must be one that builds.
    from allocator.policies import parse_policy

    assert parse_policy(s.policy).build() is not None


def test_environment_and_overrides(monkeypatch):
    monkeypatch.setenv("MALLEABLE_WORKERS", "6")
    monkeypatch.setenv("MALLEABLE_STATE_DIR", "/tmp/somewhere")
    monkeypatch.setenv("MALLEABLE_OVERFLOW", "drop")
    s = load_settings()
    assert s.workers == 6 and s.overflow is OverflowMode.DROP
    assert s.resolved_tracking_uri == "sqlite:////tmp/somewhere/mlflow.db"
    assert load_settings(workers=2).workers == 2  # a CLI flag wins over the environment
    assert load_settings(workers=None).workers == 6  # an absent flag does not


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("MALLEABLE_WORKERS", "many", "MALLEABLE_WORKERS='many'"),
        ("MALLEABLE_WORKERS", "0", "MALLEABLE_WORKERS='0'"),
        ("MALLEABLE_INTERVAL_S", "-3", "MALLEABLE_INTERVAL_S='-3'"),
        ("MALLEABLE_CLUSTER", "mars", "MALLEABLE_CLUSTER='mars'"),
        ("MALLEABLE_POLICY", "nope", "MALLEABLE_POLICY='nope': unknown policy"),
        ("MALLEABLE_OVERFLOW", "maybe", "MALLEABLE_OVERFLOW='maybe'"),
        ("MALLEABLE_CLUSTER", "address", "MALLEABLE_SCHEDULER_ADDRESS"),
    ],
)
def test_bad_setting_is_one_line_naming_variable(monkeypatch, var, value, expected):
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_setting_on_the_cli_exits_2_without_traceback(monkeypatch):
    from flows.commands.cli import app

    monkeypatch.setenv("MALLEABLE_WORKERS", "many")
    result = CliRunner().invoke(app, ["ui"])
    assert result.exit_code == 2
    assert "MALLEABLE_WORKERS='many'" in result.output
    assert "Traceback" not in result.output


def test_socket_interfaces_reach_the_workers_environment(monkeypatch):
    from deploy.clusters import KubeSpec, kube_cluster_spec

    assert load_settings().worker_env == {}
    monkeypatch.setenv("MALLEABLE_GLOO_SOCKET_IFNAME", "eth1")
    monkeypatch.setenv("MALLEABLE_NCCL_SOCKET_IFNAME", "ib0")
    s = load_settings()
    assert s.worker_env == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "ib0"}
    worker = kube_cluster_spec(KubeSpec(env=s.worker_env))["spec"]["worker"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert env["GLOO_SOCKET_IFNAME"] == "eth1" and env["NCCL_SOCKET_IFNAME"] == "ib0"
