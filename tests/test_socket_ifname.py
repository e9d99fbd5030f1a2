"""Each rank connects gloo/nccl on the interface holding its worker's own address, unless told."""

from elastic_tasks.devices import interface_of, own_socket_env

HOST = {"lo": ["127.0.0.1", "::1"], "eth0": ["10.213.0.11", "fe80::1%eth0"], "ib0": ["192.168.7.3"]}


def test_the_interface_holding_the_address_is_named():
    assert interface_of("10.213.0.11", HOST) == "eth0"
    assert interface_of("192.168.7.3", HOST) == "ib0"
    assert interface_of("fe80::1", HOST) == "eth0"
    assert interface_of("10.213.0.12", HOST) is None


def test_both_variables_are_set_from_the_workers_address():
    assert own_socket_env("10.213.0.11", {}, HOST) == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}


def test_the_users_setting_wins():
    assert own_socket_env("10.213.0.11", {"GLOO_SOCKET_IFNAME": "ib0"}, HOST) == {"NCCL_SOCKET_IFNAME": "eth0"}
    assert own_socket_env("10.213.0.11", {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}, HOST) == {}


def test_nothing_for_loopback_names_or_foreign_addresses():
    # One host: gloo's own choice works; a name or a NATed address: no interface to name.
    assert own_socket_env("127.0.0.1", {}, HOST) == {}
    assert own_socket_env("node-3", {}, HOST) == {}
    assert own_socket_env("10.0.0.9", {}, HOST) == {}


def test_this_hosts_loopback_is_found_without_a_table():
    assert interface_of("127.0.0.1") is not None


def test_the_many_host_harness_runs_the_documented_worker_command():
    # tests/hosts must start workers the way docs/deploy.md tells users to (its only extra: no dashboard).
    import re
    from pathlib import Path

    from tests.hosts.netns import WORKER_ARGS, WORKER_ENV

    doc = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    m = re.search(r"`((?:\w+=\w+ )+)dask worker tcp://scheduler:8786 ([^`]*)`", doc)
    assert m, "docs/deploy.md no longer gives the worker command"
    assert WORKER_ENV == dict(pair.split("=") for pair in m[1].split())
    assert [a for a in WORKER_ARGS if a != "--no-dashboard"] == m[2].split()
