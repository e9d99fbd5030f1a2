"""Where Dask workers come from: a LocalCluster, an existing scheduler, or Kubernetes.

Every worker stands for one GPU and advertises the Dask resource ``GPU=1``, so a task that
asks for ``resources={"GPU": 1}`` lands on a worker of its own. On a machine without GPUs
the same layout gives *virtual* GPUs (one single-threaded worker process each), which is
how tests and the quickstart run.
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import dask
from distributed import Client, SpecCluster
import distributed.deploy.subprocess
from distributed.deploy.subprocess import SubprocessCluster

from elastic_tasks.cluster import TRAINING_WORKER_ENV, training_worker_config

GPU_RESOURCE = "GPU"
K8S_GPU = "nvidia.com/gpu"
# The image's non-root user (deploy/Dockerfile).
RUN_AS_USER = 10001


def local_cluster(workers: int, *, memory_limit: str | int = 0, dashboard: bool = False) -> SpecCluster:
    """One single-threaded worker process per (virtual) GPU, each with ``GPU=1``.

    Workers run in their own ``dask spec`` subprocesses rather than ``LocalCluster``'s
    spawned children: spawn re-imports the caller's ``__main__`` in every worker, which from
    the CLI is prefect + mlflow + torch — about 35 s instead of 8 s for four workers on two
    cores. The workers' nanny gets the allocator settings training needs
    (``training_worker_config``).
    """
    if not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"workers={workers!r}: must be a positive integer")
    # The working directory on the workers' path, so local entry points import; the config
    # through the variable Dask reads at import (``DASK_*`` variables would lower-case the
    # keys, and environment names are case-sensitive).
    path = os.pathsep.join([os.getcwd()] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    inherited = os.environ.get("DASK_INTERNAL_INHERIT_CONFIG")
    config = dask.config.merge(dask.config.deserialize(inherited) if inherited else {}, training_worker_config())
    with _environ(PYTHONPATH=path, DASK_INTERNAL_INHERIT_CONFIG=dask.config.serialize(config), **_subprocess_logging()), _own_process_groups():
        return SubprocessCluster(
            n_workers=workers,
            threads_per_worker=1,
            worker_kwargs={"resources": {GPU_RESOURCE: 1}, "memory_limit": memory_limit},
            dashboard_address=":0" if dashboard else None,
        )


class _SpawnInOwnGroup:
    """``asyncio`` as ``distributed.deploy.subprocess`` sees it, but every process it spawns leads
    a process group of its own. Ctrl-C in a terminal signals the whole foreground group: the
    scheduler and workers would die at once, under ranks that are about to stop cleanly, and
    every shutdown step would then wait out Dask's connect timeouts (measured: 149 s and a
    screen of tracebacks). In their own groups they are closed by us, in order."""

    def __getattr__(self, name: str) -> object:
        return getattr(asyncio, name)

    @staticmethod
    async def create_subprocess_exec(*args: object, **kwargs: object) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(*args, process_group=0, **kwargs)


@contextmanager
def _own_process_groups() -> Iterator[None]:
    # distributed's SubprocessCluster offers no hook for Popen arguments; swap the module's view
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


@dataclass(frozen=True, slots=True)
class KubeSpec:
    """A DaskCluster custom resource whose default worker group is the GPU group."""

    name: str = "malleable"
    namespace: str = "default"
    image: str = "malleable:0.1.0"  # the scheduler's; GPU worker pods run ``gpu_image``, the CUDA build
    workers: int = 4
    gpus_per_worker: int = 1
    cpu: str = "4"
    memory: str = "16Gi"
    env: Mapping[str, str] = field(default_factory=dict)
    # GPU pods need torch built for CUDA; the default image carries the CPU wheel. None:
    # ``<image>-cuda`` (deploy/Dockerfile's TORCH_INDEX build argument makes it).
    worker_image: str | None = None
    scheduler_cpu: str = "1"
    scheduler_memory: str = "2Gi"  # it unpickles every task, so it imports torch

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum() or self.name != self.name.lower():
            raise ValueError(f"KubeSpec.name={self.name!r}: must be a lowercase DNS label (letters, digits, dashes)")
        if not (isinstance(self.workers, int) and self.workers >= 0):
            raise ValueError(f"KubeSpec.workers={self.workers!r}: must be an integer >= 0")
        if not (isinstance(self.gpus_per_worker, int) and self.gpus_per_worker >= 1):
            raise ValueError(f"KubeSpec.gpus_per_worker={self.gpus_per_worker!r}: must be a positive integer")
        if not self.image:
            raise ValueError(f"KubeSpec.image={self.image!r}: must name a container image")


    @property
    def gpu_image(self) -> str:
        if self.worker_image:
            return self.worker_image
        repository, _, tag = self.image.rpartition(":")
        if repository and "/" not in tag:
            return f"{repository}:{tag}-cuda"
        return f"{self.image}:latest-cuda"

    def unique(self) -> KubeSpec:
        """This spec under a name of its own: a run owns (and on close deletes) its DaskCluster,
        so two runs must never share one."""
        import dataclasses
        import uuid

        return dataclasses.replace(self, name=f"{self.name}-{uuid.uuid4().hex[:8]}")


# The restricted Pod Security Standard: non-root, no privilege escalation, no capabilities,
# the runtime's default seccomp profile (tests/test_k8s_validation.py checks every pod).
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}


def _non_root(container: dict) -> None:
    container["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def kube_cluster_spec(spec: KubeSpec) -> dict:
    """The DaskCluster resource (a plain dict; built offline, nothing contacts a cluster)."""
    from dask_kubernetes.operator import make_cluster_spec

    env = {**TRAINING_WORKER_ENV, **spec.env}
    cluster = copy.deepcopy(make_cluster_spec(name=spec.name, image=spec.image, n_workers=spec.workers, env=env or None))
    cluster["metadata"]["namespace"] = spec.namespace
    worker = cluster["spec"]["worker"]["spec"]["containers"][0]
    worker["image"] = spec.gpu_image
    # One Dask worker per GPU (gpu_worker_args); no memory limit in the nanny: the pod's limit
    # bounds it, and a nanny that restarts a worker over a threshold kills a rank mid-step.
    worker["args"] = gpu_worker_args(spec.gpus_per_worker)
    worker["resources"] = {
        "limits": {K8S_GPU: spec.gpus_per_worker, "cpu": spec.cpu, "memory": spec.memory},
        "requests": {K8S_GPU: spec.gpus_per_worker, "cpu": spec.cpu, "memory": spec.memory},
    }
    _non_root(worker)
    pod = cluster["spec"]["worker"]["spec"]
    pod["tolerations"] = [{"key": K8S_GPU, "operator": "Exists", "effect": "NoSchedule"}]
    pod["securityContext"] = dict(POD_SECURITY)
    scheduler_pod = cluster["spec"]["scheduler"]["spec"]
    scheduler = scheduler_pod["containers"][0]
    # distributed 2026 ships no `dask-scheduler` console script: the subcommand form.
    scheduler["args"] = ["dask", "scheduler", "--host", "0.0.0.0"]
    scheduler["resources"] = {
        "requests": {"cpu": spec.scheduler_cpu, "memory": spec.scheduler_memory},
        "limits": {"memory": spec.scheduler_memory},
    }
    _non_root(scheduler)
    scheduler_pod["securityContext"] = dict(POD_SECURITY)
    return cluster


def gpu_worker_args(gpus_per_pod: int) -> list[str]:
    """The worker pod's command: one Dask worker, hence one rank, per GPU of the pod.

    One GPU: a plain ``dask worker`` with ``GPU=1``. More: ``dask cuda worker`` (dask-cuda, the
    image's ``[gpu]`` extra) starts one worker process per GPU, each seeing its own device
    first (``CUDA_VISIBLE_DEVICES`` rotated) and each advertising ``GPU=1``, so ranks per pod
    equal GPUs per pod. A single ``dask worker`` advertising ``GPU=N`` would run one rank and
    leave N-1 GPUs idle.
    """
    if gpus_per_pod == 1:
        return [
            "dask", "worker", "--nthreads", "1", "--memory-limit", "0", "--resources", f"{GPU_RESOURCE}=1",
            "--name", "$(DASK_WORKER_NAME)", "--dashboard", "--dashboard-address", "8788",
        ]  # fmt: skip
    return [
        "dask", "cuda", "worker", "--nthreads", "1", "--memory-limit", "0", "--resources", f"{GPU_RESOURCE}=1",
        "--name", "$(DASK_WORKER_NAME)", "--dashboard-address", "8788",
    ]  # fmt: skip


def kubernetes_cluster(spec: KubeSpec):  # pragma: no cover - needs a Kubernetes cluster with the Dask operator
    from dask_kubernetes.operator import KubeCluster

    return KubeCluster(custom_cluster_spec=kube_cluster_spec(spec), namespace=spec.namespace)


@contextmanager
def connect(kind: str, *, workers: int = 4, address: str | None = None, kube: KubeSpec | None = None) -> Iterator[Client]:
    """A Dask client for the configured cluster kind; the cluster lives as long as the block."""
    if kind == "local":
        with local_cluster(workers) as cluster, Client(cluster) as client:
            client.wait_for_workers(workers, timeout=120)  # subprocess workers register after start
            yield client
    elif kind == "address":
        if not address:
            raise ValueError("scheduler_address=None: cluster=address needs a scheduler address")
        with Client(address) as client:
            yield client
    elif kind == "kubernetes":
        with kubernetes_cluster((kube or KubeSpec(workers=workers)).unique()) as cluster, Client(cluster) as client:
            yield client
    else:
        raise ValueError(f"cluster={kind!r}: must be local, address or kubernetes")


def gpu_workers(client: Client) -> list[str]:
    """Addresses of the workers advertising a GPU, sorted (stable rank placement)."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return sorted(addr for addr, w in info.items() if w.get("resources", {}).get(GPU_RESOURCE, 0) >= 1)
