"""Dask clusters on this machine: one worker per (virtual or real) GPU, each advertising ``GPU=1``.

On CPU the GPU is virtual: the resource only makes Dask place one rank per worker. Where
CUDA is present ``local_gpu_cluster`` gives each worker its own GPU first
(``CUDA_VISIBLE_DEVICES`` rotated per worker): through dask-cuda's ``LocalCUDACluster`` when
the ``[gpu]`` extra is installed, else through the same rotation on a plain ``SpecCluster``
(``elastic_tasks.devices.cuda_worker_env``). ``local_cluster`` is the CLI's: the scheduler and
the nannies in ``dask spec`` subprocesses of their own (``deploy.nanny_group``), apart from the
caller's process group and secrets, the workers forked from one preloaded server.
Clusters are built inside functions (never at import) so spawned workers can import us.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dask
import distributed.deploy.subprocess
from distributed import LocalCluster, Nanny, Scheduler, SpecCluster, Worker
from distributed.deploy.subprocess import SubprocessScheduler

from deploy.forkserver import FORKSERVER, ExactEnvironWorker, preloaded_forkserver
from deploy.nanny_group import direct_dask_spec, group_spec
from deploy.worker_env import conceal_secrets, worker_environ
from elastic_tasks.devices import GPU_RESOURCE, cuda_worker_env


# Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536 (to hand memory back), which
# also switches off glibc's dynamic mmap threshold: every large tensor a training step
# allocates becomes a fresh mmap plus page faults. Measured (resnet_small, batch 128, one
# thread, three runs each): 92-96 ms per step by default, 117-150 ms with Dask's setting,
# 71-104 ms with it and the mmap threshold pinned at glibc's 64-bit maximum, set here.
TRAINING_WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}

# A recipe's DataLoader starts worker processes of its own, which a daemonic process may not
# (``AssertionError: daemonic processes are not allowed to have children``). The nanny reads
# ``distributed.worker.daemon`` each time it (re)starts its worker, in the nanny's process: so
# a nanny in its own process (``dask worker``, ``dask spec``, Kubernetes) needs it in its
# environment or inherited config for good, not only while a cluster is being built.
NON_DAEMONIC_ENV = {"DASK_DISTRIBUTED__WORKER__DAEMON": "False"}


# Dask's statistical profiler wakes every 10 ms on every worker and walks each thread's stack
# under the GIL: a training rank's Python thread waits for it each time, and an idle worker
# spends ~a quarter of its CPU on it (measured: 3.9 -> 2.9 CPU-s per 30 s on 3 idle workers).
# The dashboard's profile page is what is lost; DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED set
# on the workers is not overridden by the nanny's inherited config for a `dask worker` started by hand.
NO_WORKER_PROFILER = {"distributed.worker.profile.enabled": False}

# Every Dask server (scheduler, nanny, worker) wakes every 20 ms by default only to time its own
# event loop (the "event loop was unresponsive" warning); a training rank's thread waits on the
# GIL for each wake-up. Measured: an idle two-worker cluster 3.2 CPU-s per 30 s at 20 ms, 1.1 at
# 100 ms. Dask's own test suite runs at 500 ms, as do our clusters; a blocked loop is still
# reported, only measured less often.
QUIET_TICK = {"distributed.admin.tick.interval": "500ms"}
# Both, for workers whose nanny is started by others (``dask worker``, Kubernetes pods): the
# variables Dask reads at import.
QUIET_WORKER_ENV = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False", "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "500ms"}


def training_worker_config() -> dict:
    """Dask config for nanny processes whose workers train: the environment they set before
    spawning, and non-daemonic workers (at the first start and at every nanny restart)."""
    return {
        "distributed": {
            "nanny": {"pre-spawn-environ": dict(TRAINING_WORKER_ENV)}, "worker": {"daemon": False, "profile": {"enabled": False}},
            "admin": {"tick": {"interval": QUIET_TICK["distributed.admin.tick.interval"]}},
        }
    }


class TrainingNanny(Nanny):
    """A nanny living in the caller's process (``LocalCluster``, ``SpecCluster``) whose worker is
    non-daemonic (and unprofiled) at every start, restarts included, and forked from a server
    that imported the training code once rather than spawned afresh.

    Such a nanny reads ``distributed.worker.daemon`` from the caller's config whenever it
    (re)starts its worker, long after the ``dask.config.set`` block that built the cluster has
    ended: a worker the nanny restarted came back daemonic and every DataLoader with workers
    failed on it. The setting is held only while this nanny starts its process; every nanny of
    ours wants the same value, so two starting at once agree.
    """

    async def instantiate(self):  # type: ignore[no-untyped-def]  # noqa: ANN201 - distributed's signature
        # Forked from a server that imported torch once (deploy/forkserver.py), with the environment
        # a spawned child would start with now: this process's, less its secrets, plus the nanny's.
        if self.Worker is Worker:
            self.Worker = ExactEnvironWorker
        environ = {**worker_environ(), **self.pre_spawn_env, **self.env}
        self.worker_kwargs["environ"] = environ
        if self.process is not None:  # a restart reuses the first start's arguments
            self.process.worker_kwargs["environ"] = environ
        with dask.config.set({"distributed.worker.daemon": False, **NO_WORKER_PROFILER, **QUIET_TICK, **FORKSERVER}):
            preloaded_forkserver()
            return await super().instantiate()


def _worker_config(extra_env: dict[str, str] | None) -> dict:
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **TRAINING_WORKER_ENV, **(extra_env or {})}
    # Non-daemonic worker processes: a recipe's DataLoader may start worker processes of its own.
    return {"distributed.nanny.pre-spawn-environ": environ, "distributed.worker.daemon": False, **NO_WORKER_PROFILER, **QUIET_TICK}


class _CancelledWaitFilter(logging.Filter):
    """Drops the record of a scheduler-side wait cancelled by the scheduler's own close.

    A rank's plan watcher long-polls a Dask ``Event`` on the scheduler (``Board.wait_published``,
    up to 2 s) and may still be waiting when the job ends; a cluster closed within that time
    cancels the wait, and distributed logs the cancellation as an ERROR with a traceback
    (``distributed.event``) on the terminal of the process hosting the scheduler — ours, for a
    ``LocalCluster``. Nothing failed: the cluster was closed on purpose. Other errors stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


_CANCELLED_WAIT = _CancelledWaitFilter()


def quiet_cancelled_waits() -> None:
    """Installs the filter above on ``distributed.event`` once per process (idempotent)."""
    logger = logging.getLogger("distributed.event")
    if _CANCELLED_WAIT not in logger.filters:
        logger.addFilter(_CANCELLED_WAIT)


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
    conceal_secrets()  # nannies here spawn (and restart) workers that inherit the C environment
    quiet_cancelled_waits()  # the scheduler lives in this process
    visible = visible_cuda_devices()
    if visible:
        return local_cuda_cluster(n_workers, visible, threads_per_worker=threads_per_worker, memory_limit=memory_limit, env=env)
    with dask.config.set(_worker_config(env)):
        return LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            resources={GPU_RESOURCE: 1},
            dashboard_address=":0",
            memory_limit=memory_limit,
            worker_class=TrainingNanny,
            silence_logs=log_level,  # the cluster's and workers' logging level (40: errors only)
        )


def visible_cuda_devices() -> list[str]:
    """The GPUs this process may hand to workers ([] without CUDA: virtual GPUs)."""
    if not gpu_device_nodes():
        return []  # no GPU torch could open: asked without importing torch (~2 CPU-s a CLI, a service)
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [d for d in listed.split(",") if d.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_device_nodes(dev: Path = Path("/dev")) -> bool:
    """Whether a Linux host shows a device node a GPU build of torch opens (NVIDIA's control node or
    a numbered GPU, ROCm's kfd): without one ``torch.cuda.is_available()`` is False. Elsewhere
    (no /dev to read) True: torch is asked."""
    if not sys.platform.startswith("linux"):
        return True
    return (dev / "nvidiactl").exists() or (dev / "kfd").exists() or any(p.name[6:].isdigit() for p in dev.glob("nvidia[0-9]*"))


def local_cuda_cluster(
    n_workers: int, visible: list[str], *, threads_per_worker: int = 1, memory_limit: str | int | None = 0, env: dict[str, str] | None = None
) -> SpecCluster:
    """One worker per GPU, each started seeing its own device first; dask-cuda's when installed."""
    worker_envs = cuda_worker_env(visible, n_workers)  # raises, naming n_workers, if GPUs are short
    conceal_secrets()  # nannies here spawn (and restart) workers that inherit the C environment
    with dask.config.set(_worker_config(env)):
        try:
            from dask_cuda import LocalCUDACluster  # the [gpu] extra; imported only where CUDA is present
        except ImportError:
            return cuda_spec_cluster(worker_envs, threads_per_worker=threads_per_worker, memory_limit=memory_limit)
        return LocalCUDACluster(**cuda_cluster_kwargs(n_workers, visible, threads_per_worker=threads_per_worker, memory_limit=memory_limit))


def cuda_cluster_kwargs(n_workers: int, visible: list[str], *, threads_per_worker: int = 1, memory_limit: str | int | None = 0) -> dict[str, object]:
    """What ``local_cuda_cluster`` hands dask-cuda's ``LocalCUDACluster``.

    ``worker_class=TrainingNanny``: ``LocalCUDACluster`` (a ``LocalCluster``; dask-cuda 25.02 to
    26.10 alike) passes a ``Nanny`` subclass through to ``LocalCluster`` as is (a worker class
    would be wrapped in a plain ``Nanny``). Its default nanny reads the daemon flag from the
    caller's config at every restart, after the block above has ended: the restarted worker came
    back daemonic, and every DataLoader with workers failed on it.
    """
    return {
        "n_workers": n_workers,
        "CUDA_VISIBLE_DEVICES": ",".join(visible),
        "threads_per_worker": threads_per_worker,
        "resources": {GPU_RESOURCE: 1},
        "memory_limit": memory_limit,
        "dashboard_address": ":0",
        "silence_logs": 40,
        "worker_class": TrainingNanny,
    }


def cuda_spec_cluster(worker_envs: list[dict[str, str]], *, threads_per_worker: int = 1, memory_limit: str | int | None = 0) -> SpecCluster:
    """The rotation without dask-cuda: worker i's nanny starts it with ``worker_envs[i]``.

    Usable (and tested) on a CPU machine: the environment is all it sets.
    """
    workers = {
        f"gpu-{i}": {
            "cls": TrainingNanny,
            "options": {"nthreads": threads_per_worker, "resources": {GPU_RESOURCE: 1}, "memory_limit": memory_limit, "env": dict(e), "silence_logs": 40},
        }
        for i, e in enumerate(worker_envs)
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0"}}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40)


def local_cluster(workers: int, *, memory_limit: str | int = 0, dashboard: bool = False, visible: list[str] | None = None) -> SpecCluster:
    """One single-threaded worker process per (virtual) GPU, each with ``GPU=1``.

    Where CUDA is present (``visible``: the GPUs to hand out, default ``visible_cuda_devices()``)
    this is ``local_cuda_cluster``: each worker sees its own GPU first, or every rank would
    train on GPU 0 and nccl refuse two ranks there. On CPU the scheduler runs in a ``dask spec``
    subprocess and every nanny in one more (``deploy.nanny_group``), each leading a process
    group of its own and started without the caller's secrets; the workers fork from the
    nannies' one preloaded fork server. Measured on two idle cores, four workers to warm
    (``benchmarks/cluster_start_bench.py``): 4.7 s and 4.9 CPU-s, against 7.4 s and 13.6 CPU-s
    with distributed's ``SubprocessCluster`` (one ``dask spec`` process per worker, each spawning
    a worker that imports torch afresh), which this used before.
    """
    if not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"workers={workers!r}: must be a positive integer")
    conceal_secrets()
    visible = visible_cuda_devices() if visible is None else visible
    if visible:
        return local_cuda_cluster(workers, visible, memory_limit=memory_limit)
    host = "127.0.0.1"
    scheduler = {
        "cls": SubprocessScheduler,
        "options": {"scheduler_kwargs": {"host": host, "port": 0, "dashboard": dashboard, "dashboard_address": ":0" if dashboard else None}},
    }
    nanny = {"host": host, "nthreads": 1, "silence_logs": logging.WARN, "resources": {GPU_RESOURCE: 1}, "memory_limit": memory_limit}
    with subprocess_cluster_start():
        return SpecCluster(workers={"gpu": group_spec("gpu", workers, nanny)}, scheduler=scheduler, name="LocalSubprocessCluster", silence_logs=logging.WARN)


@contextmanager
def subprocess_cluster_start() -> Iterator[None]:
    """What a cluster of ``dask spec`` subprocesses is started inside: each process in a process
    group of its own, the working directory on its path (local entry points import), the
    training config through the variable Dask reads at import (``DASK_*`` variables would
    lower-case the keys, and environment names are case-sensitive), the caller's log level."""
    path = os.pathsep.join([os.getcwd()] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    inherited = os.environ.get("DASK_INTERNAL_INHERIT_CONFIG")
    config = dask.config.merge(dask.config.deserialize(inherited) if inherited else {}, training_worker_config())
    with _environ(PYTHONPATH=path, DASK_INTERNAL_INHERIT_CONFIG=dask.config.serialize(config), **_subprocess_logging()), _own_process_groups():
        yield


class _SpawnInOwnGroup:
    """``asyncio`` as ``distributed.deploy.subprocess`` sees it, but every process it spawns leads
    a process group of its own. Ctrl-C in a terminal signals the whole foreground group: the
    scheduler and workers would die at once, under ranks that are about to stop cleanly, and
    every shutdown step would then wait out Dask's connect timeouts (measured: 149 s and a
    screen of tracebacks). In their own groups they are closed by us, in order. ``dask spec`` is
    started as its own module (``deploy.nanny_group.DASK_SPEC``)."""

    def __getattr__(self, name: str) -> object:
        return getattr(asyncio, name)

    @staticmethod
    async def create_subprocess_exec(*args: object, **kwargs: object) -> asyncio.subprocess.Process:
        # The scheduler and workers start without the service's secrets (deploy/worker_env.py).
        kwargs.setdefault("env", worker_environ())
        return await asyncio.create_subprocess_exec(*direct_dask_spec(tuple(map(str, args))), process_group=0, **kwargs)


@contextmanager
def _own_process_groups() -> Iterator[None]:
    # distributed's SubprocessScheduler offers no hook for Popen arguments; swap the module's view
    # of asyncio only while the cluster starts its processes, then put it back.
    module = distributed.deploy.subprocess
    before = module.asyncio
    module.asyncio = _SpawnInOwnGroup()  # type: ignore[assignment]
    try:
        yield
    finally:
        module.asyncio = before


def _subprocess_logging() -> dict[str, str]:
    """The environment that sets the subprocesses' ``distributed`` log level from the caller's
    (the CLI: errors only unless ``-v``). distributed logs a failed task at ERROR with its whole
    traceback; the job's failure says it in one line, so a quiet caller gets CRITICAL there."""
    level = os.environ.get("DASK_LOGGING__DISTRIBUTED")
    if not level:
        return {}
    return {"DASK_LOGGING__DISTRIBUTED": "critical" if level.lower() in ("error", "critical") else level}


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the subprocesses started inside; restore the caller's after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in before.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
