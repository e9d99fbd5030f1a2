"""Worker groups: one Dask worker per GPU, each advertising the resource ``GPU=1``.

On CPU the GPU is virtual: the resource only makes Dask place one rank per worker. Where
CUDA is present each worker sees its own GPU first (``CUDA_VISIBLE_DEVICES`` rotated per
worker): through dask-cuda's ``LocalCUDACluster`` when the ``[gpu]`` extra is installed,
else through the same rotation on a plain ``SpecCluster`` (``devices.cuda_worker_env``).
Clusters are built inside functions (never at import) so spawned workers can import us.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import dask
from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.comm import get_address_host

from elastic_tasks.devices import cuda_worker_env, loopback_warning

log = logging.getLogger(__name__)

# Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536 (to hand memory back), which
# also switches off glibc's dynamic mmap threshold: every large tensor a training step
# allocates becomes a fresh mmap plus page faults. Measured (resnet_small, batch 128, one
# thread, three runs each): 92-96 ms per step by default, 117-150 ms with Dask's setting,
# 71-104 ms with it and the mmap threshold pinned at glibc's 64-bit maximum, set here.
TRAINING_WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}


def training_worker_config() -> dict:
    """Dask config for worker processes that train: the environment their nanny sets before spawning."""
    return {"distributed": {"nanny": {"pre-spawn-environ": dict(TRAINING_WORKER_ENV)}}}


def _worker_config(extra_env: dict[str, str] | None) -> dict:
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **TRAINING_WORKER_ENV, **(extra_env or {})}
    # Non-daemonic worker processes: a recipe's DataLoader may start worker processes of its own.
    return {"distributed.nanny.pre-spawn-environ": environ, "distributed.worker.daemon": False}


def local_gpu_cluster(
    n_workers: int, *, threads_per_worker: int = 1, memory_limit: str | int | None = 0, env: dict[str, str] | None = None,
    log_level: int = 40,
) -> LocalCluster | SpecCluster:
    """A process-per-worker cluster with ``GPU=1`` on every worker: one per real GPU where CUDA is present.

    ``env`` is set in every worker (e.g. ``GLOO_SOCKET_IFNAME``, ``devices.socket_env``);
    ``log_level`` is the cluster's and workers' logging level (40: errors only).
    """
    if not (isinstance(n_workers, int) and n_workers >= 1):
        raise ValueError(f"n_workers={n_workers!r}: must be a positive integer")
    visible = visible_cuda_devices()
    if visible:
        return local_cuda_cluster(n_workers, visible, threads_per_worker=threads_per_worker, memory_limit=memory_limit, env=env)
    with dask.config.set(_worker_config(env)):
        return LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            resources={"GPU": 1},
            dashboard_address=":0",
            memory_limit=memory_limit,
            silence_logs=log_level,  # the cluster's and workers' logging level (40: errors only)
        )


def visible_cuda_devices() -> list[str]:
    """The GPUs this process may hand to workers ([] without CUDA: virtual GPUs)."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [d for d in listed.split(",") if d.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def local_cuda_cluster(
    n_workers: int, visible: list[str], *, threads_per_worker: int = 1, memory_limit: str | int | None = 0, env: dict[str, str] | None = None
) -> SpecCluster:
    """One worker per GPU, each started seeing its own device first; dask-cuda's when installed."""
    worker_envs = cuda_worker_env(visible, n_workers)  # raises, naming n_workers, if GPUs are short
    with dask.config.set(_worker_config(env)):
        try:
            from dask_cuda import LocalCUDACluster  # the [gpu] extra; imported only where CUDA is present
        except ImportError:
            return cuda_spec_cluster(worker_envs, threads_per_worker=threads_per_worker, memory_limit=memory_limit)
        return LocalCUDACluster(
            n_workers=n_workers,
            CUDA_VISIBLE_DEVICES=",".join(visible),
            threads_per_worker=threads_per_worker,
            resources={"GPU": 1},
            memory_limit=memory_limit,
            dashboard_address=":0",
            silence_logs=40,
        )


def cuda_spec_cluster(worker_envs: list[dict[str, str]], *, threads_per_worker: int = 1, memory_limit: str | int | None = 0) -> SpecCluster:
    """The rotation without dask-cuda: worker i's nanny starts it with ``worker_envs[i]``.

    Usable (and tested) on a CPU machine: the environment is all it sets.
    """
    workers = {
        f"gpu-{i}": {
            "cls": Nanny,
            "options": {"nthreads": threads_per_worker, "resources": {"GPU": 1}, "memory_limit": memory_limit, "env": dict(e), "silence_logs": 40},
        }
        for i, e in enumerate(worker_envs)
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0"}}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40)


def check_worker_hosts(client: Client) -> str | None:
    """Log (and return) a warning when GPU workers span hosts and one host name resolves to loopback."""
    warning = loopback_warning(get_address_host(addr) for addr in gpu_workers(client))
    if warning:
        log.warning(warning)
    return warning


def warm_up(client: Client, entrypoint: str, workers: list[str] | None = None) -> None:
    """Import torch and build the recipe on the workers (default: all), so a rank started later joins fast.

    The scheduler imports the trainer too: it unpickles every submitted task, so the first
    rank task would otherwise make it import torch while the job's start waits (measured:
    the first job's plan publish took 1.3-1.9 s, later ones 0.01 s).
    """
    check_worker_hosts(client)
    client.run(_warm, entrypoint, workers=workers)
    client.run_on_scheduler(_import_trainer)


class TrainerImport(WorkerPlugin):
    """Imports the trainer (torch, torch.distributed) on every worker, including workers that join
    later: a long-lived service's first rank on a fresh worker then pays the regroup, not the import."""

    name = "malleable-trainer-import"

    def setup(self, worker) -> None:  # noqa: ANN001 - distributed's Worker
        _import_trainer()


def warm_up_trainer(client: Client) -> None:
    client.register_plugin(TrainerImport())
    client.run_on_scheduler(_import_trainer)


def _import_trainer() -> None:
    import elastic_tasks.trainer  # noqa: F401  (what a rank task's pickle refers to)


def _warm(entrypoint: str) -> None:
    import elastic_tasks.trainer  # noqa: F401  (torch.distributed, DDP)
    from elastic_tasks.recipe import load_entry_point

    recipe = load_entry_point(entrypoint)
    # The first optimizer construction imports torch._dynamo: seconds, once per process.
    recipe.make_optimizer(recipe.build_model().parameters(), recipe.base_lr)


def gpu_workers(client: Client) -> list[str]:
    """Addresses of the workers that offer a GPU, in a stable order."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return sorted(addr for addr, w in info.items() if w.get("resources", {}).get("GPU", 0) >= 1)


@dataclass(slots=True)
class WorkerPool:
    """Which GPU workers are free; jobs take and give back whole workers."""

    client: Client
    busy: dict[str, str] = field(default_factory=dict)  # worker address -> job id

    def alive(self) -> list[str]:
        return gpu_workers(self.client)

    def free(self) -> list[str]:
        alive = set(self.alive())
        for addr in [a for a in self.busy if a not in alive]:
            del self.busy[addr]  # a dead worker frees nothing, but must not stay booked
        return [a for a in sorted(alive) if a not in self.busy]

    def take(self, job_id: str, n: int) -> list[str]:
        free = self.free()
        if n > len(free):
            raise ValueError(f"gpus={n!r}: only {len(free)} free GPU worker(s) of {len(self.alive())}")
        chosen = free[:n]
        for addr in chosen:
            self.busy[addr] = job_id
        return chosen

    def give_back(self, workers: Iterable[str]) -> None:
        for addr in workers:
            self.busy.pop(addr, None)
