"""One GPU per rank, checked where it can be on a CPU machine: the environment each worker is
started with, the backend string of nccl jobs, and the multi-host loopback warning."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from distributed import Client

from deploy.local import cuda_spec_cluster
from elastic_tasks.cluster import check_worker_hosts, gpu_workers
from elastic_tasks.devices import MIXED_BACKEND, cuda_worker_env, loopback_warning, process_group_backend, rank_device, socket_env


def test_each_worker_sees_its_own_gpu_first():
    envs = cuda_worker_env(["0", "1", "2", "3"])
    firsts = [e["CUDA_VISIBLE_DEVICES"].split(",")[0] for e in envs]
    assert firsts == ["0", "1", "2", "3"]  # one distinct device per worker: rank -> cuda:0 of its view
    for e in envs:
        assert sorted(e["CUDA_VISIBLE_DEVICES"].split(",")) == ["0", "1", "2", "3"]
    assert cuda_worker_env(["GPU-aa", "GPU-bb"], 1) == [{"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}]
    with pytest.raises(ValueError, match="n_workers=3"):
        cuda_worker_env(["0", "1"], 3)
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        cuda_worker_env([])


def test_nccl_jobs_get_a_gloo_side_for_cpu_tensors_and_cpu_ranks_stay_on_cpu():
    assert process_group_backend("nccl") == MIXED_BACKEND == "cpu:gloo,cuda:nccl"
    assert process_group_backend("gloo") == "gloo"
    assert rank_device("gloo") == torch.device("cpu")
    with pytest.raises(ValueError, match="backend='mpi'"):
        process_group_backend("mpi")
    assert socket_env("eth0", None) == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert socket_env("eth0", "ib0") == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "ib0"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: rank_device('nccl') sets the current device")
def test_rank_device_on_a_gpu_is_the_first_visible_and_current():
    assert rank_device("nccl") == torch.device("cuda", 0) and torch.cuda.current_device() == 0


def test_loopback_warning_only_for_several_hosts():
    table = {"node-a": ["10.0.0.5"], "node-b": ["127.0.1.1"], "node-c": ["::1"]}
    warning = loopback_warning(["node-a", "node-b", "node-a"], resolve=table.__getitem__)
    assert warning is not None and "node-b -> 127.0.1.1" in warning and "node-a ->" not in warning
    assert "node-c -> ::1" in loopback_warning(["node-a", "node-c"], resolve=table.__getitem__)
    assert loopback_warning(["node-b", "node-b"], resolve=table.__getitem__) is None  # one host: loopback is fine
    assert loopback_warning(["node-a", "node-a"], resolve=table.__getitem__) is None
    # Real resolution: "localhost" is loopback on every machine.
    assert "localhost ->" in loopback_warning(["localhost", "10.255.255.1"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_spec_cluster_starts_each_worker_with_its_rotation(caplog):
    # Without dask-cuda the nanny sets the rotation; CPU workers still get the environment.
    envs = cuda_worker_env(["5", "7"])
    with cuda_spec_cluster(envs) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        assert sorted(seen.values()) == ["5,7", "7,5"]
        assert len(gpu_workers(client)) == 2
        with caplog.at_level(logging.WARNING):
            assert check_worker_hosts(client) is None  # one host (127.0.0.1): no warning


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_cli_local_cluster_gives_each_worker_its_own_gpu_where_cuda_is_present():
    """`malleable run`/`serve` with cluster=local on a GPU host: the environment each worker is
    started with (testable on CPU: the rotation is all that differs)."""
    from deploy.local import local_cluster

    with local_cluster(2, visible=["0", "1"]) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=90)
        seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        assert sorted(seen.values()) == ["0,1", "1,0"]  # each worker's own GPU first
        assert len(gpu_workers(client)) == 2
