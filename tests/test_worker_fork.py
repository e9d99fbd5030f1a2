"""Issue 22.2: every worker we start can fork — also after its nanny restarted it.

A daemonic worker process may not have children, so any recipe whose DataLoader has workers
failed on a worker the nanny had restarted (``daemonic processes are not allowed to have
children``): the nanny reads ``distributed.worker.daemon`` at each restart, long after the
``dask.config.set`` block that built the cluster ended.
"""

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import dask
import pytest
from distributed import Client, LocalCluster, Nanny

from deploy.clusters import KubeSpec, kube_cluster_spec
from deploy.local import NON_DAEMONIC_ENV, QUIET_WORKER_ENV, cuda_cluster_kwargs, local_gpu_cluster, training_worker_config

FORK_RECIPE = '''
import torch
from functools import partial
from torch import nn
from elastic_tasks.recipe import LoaderOptions, TrainingRecipe


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, generator=g)
        return x, (x.sum() > 0).long()


def sgd(params, lr):
    return torch.optim.SGD(params, lr=lr)


def recipe():
    # Two DataLoader worker processes per rank: only a non-daemonic Dask worker may start them.
    return TrainingRecipe("forks", partial(nn.Linear, 4, 2), Rows(), nn.functional.cross_entropy, sgd, 0.05, 8,
                          loader=LoaderOptions(num_workers=2))
'''


def _daemonic() -> bool:
    return multiprocessing.current_process().daemon


def _profiling(dask_worker) -> bool:
    # Dask's statistical profiler is a periodic callback on the worker's loop: off for training workers.
    return dask.config.get("distributed.worker.profile.enabled") or "profile" in dask_worker.periodic_callbacks


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_the_nanny_restarted_is_not_daemonic():
    with local_gpu_cluster(1) as cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        [before] = client.run(_daemonic).values()
        [profiled_before] = client.run(_profiling).values()
        client.restart_workers(list(client.scheduler_info()["workers"]), timeout=120)
        client.wait_for_workers(1, timeout=60)
        [after] = client.run(_daemonic).values()
        [profiled_after] = client.run(_profiling).values()
    assert (before, after) == (False, False)
    assert (profiled_before, profiled_after) == (False, False)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_dask_cuda_path_keeps_its_workers_non_daemonic_through_a_restart():
    """Issue 34.5, by configuration (dask-cuda needs CUDA): what ``local_cuda_cluster`` hands
    ``LocalCUDACluster``, on the ``LocalCluster`` it extends (dask-cuda passes a ``Nanny``
    subclass given as ``worker_class`` through as is), built inside the non-daemonic config
    block as the factory does and restarted after it ended."""
    kwargs = cuda_cluster_kwargs(1, ["0", "1"])
    assert kwargs["CUDA_VISIBLE_DEVICES"] == "0,1" and kwargs["resources"] == {"GPU": 1}
    assert isinstance(kwargs["worker_class"], type) and issubclass(kwargs["worker_class"], Nanny)
    on_cpu = {k: v for k, v in kwargs.items() if k != "CUDA_VISIBLE_DEVICES"}  # dask-cuda's own argument
    with dask.config.set({"distributed.worker.daemon": False}):
        cluster = LocalCluster(processes=True, **on_cpu)
    with cluster, Client(cluster) as client:
        client.wait_for_workers(1, timeout=60)
        [before] = client.run(_daemonic).values()
        client.restart_workers(list(client.scheduler_info()["workers"]), timeout=120)
        client.wait_for_workers(1, timeout=60)
        [after] = client.run(_daemonic).values()
    assert (before, after) == (False, False)


def test_nanny_processes_of_their_own_get_the_flag_for_good():
    # dask spec / dask worker / Kubernetes: the nanny's own config, read at each restart.
    assert training_worker_config()["distributed"]["worker"]["daemon"] is False
    assert training_worker_config()["distributed"]["worker"]["profile"]["enabled"] is False
    with dask.config.set(training_worker_config()):
        assert dask.config.get("distributed.worker.daemon") is False
    # The variable Dask reads at import, in the worker pods' environment.
    env = {e["name"]: e["value"] for e in kube_cluster_spec(KubeSpec(workers=1))["spec"]["worker"]["spec"]["containers"][0]["env"]}
    assert env.items() >= NON_DAEMONIC_ENV.items() and env.items() >= QUIET_WORKER_ENV.items()
    refreshed = dask.config.collect(env={**NON_DAEMONIC_ENV, **QUIET_WORKER_ENV})
    assert refreshed["distributed"]["worker"]["daemon"] is False
    # No statistical profiler, and event-loop ticks every 0.5 s rather than 20 ms (idle CPU, the rank's GIL).
    assert refreshed["distributed"]["worker"]["profile"]["enabled"] is False
    assert dask.utils.parse_timedelta(refreshed["distributed"]["admin"]["tick"]["interval"]) == 0.5
    deploy_doc = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    # The documented worker command carries all three (tests/test_socket_ifname.py runs it as written).
    command = " ".join(f"{k}={v}" for k, v in {**NON_DAEMONIC_ENV, **QUIET_WORKER_ENV}.items()) + " dask worker"
    assert command in deploy_doc


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_train_with_dataloader_workers_through_a_nanny_restart(tmp_path):
    # The repro: a checkpoint-restart rescale restarts the workers under their nannies;
    # the new ranks start DataLoader workers on them.
    (tmp_path / "forkrecipe.py").write_text(FORK_RECIPE)
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": repo}
    malleable = Path(sys.executable).with_name("malleable")
    out = subprocess.run(
        [str(malleable), "train", "forkrecipe:recipe", "--gpus", "2", "--steps", "8", "--rescale-at", "4:1", "--restart",
         "--checkpoint-dir", str(tmp_path / "ckpt"), "--no-track", "--no-preflight"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "daemonic" not in out.stdout + out.stderr
    assert "steps 8" in out.stdout and "2 -> 1" in out.stdout
