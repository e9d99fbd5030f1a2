"""Where Dask workers come from: a local cluster (``deploy.local``), an existing scheduler, or Kubernetes.

Every worker stands for one GPU and advertises the Dask resource ``GPU=1``, so a task that
asks for ``resources={"GPU": 1}`` lands on a worker of its own. On a machine without GPUs
the same layout gives *virtual* GPUs (one single-threaded worker process each), which is
how tests and the quickstart run.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from distributed import Client

from deploy.local import GPU_RESOURCE, TRAINING_WORKER_ENV, local_cluster

K8S_GPU = "nvidia.com/gpu"
# The image's non-root user (deploy/Dockerfile).
RUN_AS_USER = 10001


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
