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

from deploy.local import GPU_RESOURCE, NON_DAEMONIC_ENV, QUIET_WORKER_ENV, TRAINING_WORKER_ENV, local_cluster

K8S_GPU = "nvidia.com/gpu"
# The image's non-root user (deploy/Dockerfile).
RUN_AS_USER = 10001
# Where a GPU pod's shared checkpoint volume is mounted when MALLEABLE_CHECKPOINT_DIR is not a path.
CHECKPOINT_MOUNT = "/checkpoints"


@dataclass(frozen=True, slots=True)
class KubeSpec:
    """A DaskCluster custom resource whose default worker group is the GPU group.

    One worker *pod* per GPU node, holding ``gpus_per_worker`` GPUs (all of the node's) and one
    Dask worker per GPU (``gpu_worker_args``): ranks on one node then share NVLink/PCIe and NCCL
    sees one host, not one host per GPU. Pods are kept on separate nodes (required pod
    anti-affinity) and sized per GPU: ``cpu_per_gpu`` cores, ``memory_per_gpu_gib`` GiB of memory
    of which ``shm_per_gpu_gib`` back ``/dev/shm`` (DataLoader workers and NCCL's shared-memory
    transport; the default 64 MiB of a container makes both fail).
    """

    name: str = "malleable"
    namespace: str = "default"
    image: str = "malleable:0.1.0"  # the scheduler's (CPU build); GPU pods run ``gpu_image``
    workers: int = 1  # worker pods, one per GPU node
    gpus_per_worker: int = 1
    cpu_per_gpu: float = 8.0
    memory_per_gpu_gib: float = 64.0
    shm_per_gpu_gib: float = 8.0
    env: Mapping[str, str] = field(default_factory=dict)
    # GPU pods need torch built for CUDA; the default image carries the CPU wheel. None:
    # ``<image>-cuda`` (deploy/Dockerfile's TORCH_INDEX build argument makes it).
    worker_image: str | None = None
    scheduler_cpu: str = "1"
    scheduler_memory: str = "2Gi"  # it unpickles every task, so it imports torch
    # Shared checkpoint storage: a ReadWriteMany claim every worker pod mounts at ``checkpoint_path``
    # (ranks on every node write and read the same checkpoints). None: checkpoints go to an
    # object-store URL (MALLEABLE_CHECKPOINT_DIR=s3://…, through fsspec) or nowhere shared.
    checkpoint_claim: str | None = None
    checkpoint_path: str = CHECKPOINT_MOUNT
    # Secrets whose keys become the worker pods' environment (object-store credentials, …): a
    # password reaches a pod through the environment from a Secret, never through its command line.
    env_secrets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum() or self.name != self.name.lower():
            raise ValueError(f"KubeSpec.name={self.name!r}: must be a lowercase DNS label (letters, digits, dashes)")
        if not (isinstance(self.workers, int) and self.workers >= 0):
            raise ValueError(f"KubeSpec.workers={self.workers!r}: must be an integer >= 0")
        if not (isinstance(self.gpus_per_worker, int) and self.gpus_per_worker >= 1):
            raise ValueError(f"KubeSpec.gpus_per_worker={self.gpus_per_worker!r}: must be a positive integer")
        if not self.image:
            raise ValueError(f"KubeSpec.image={self.image!r}: must name a container image")
        for name in ("cpu_per_gpu", "memory_per_gpu_gib", "shm_per_gpu_gib"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"KubeSpec.{name}={value!r}: must be a number > 0")
        if self.shm_per_gpu_gib >= self.memory_per_gpu_gib:
            raise ValueError(f"KubeSpec.shm_per_gpu_gib={self.shm_per_gpu_gib!r}: must be below memory_per_gpu_gib={self.memory_per_gpu_gib!r} (/dev/shm counts against the pod's memory)")
        if not self.checkpoint_path.startswith("/"):
            raise ValueError(f"KubeSpec.checkpoint_path={self.checkpoint_path!r}: must be an absolute path")

    @property
    def gpu_image(self) -> str:
        """``worker_image``, else the CUDA build of ``image``: ``<repository>:<tag>-cuda`` (an image
        already tagged ``…-cuda`` is taken as it is, never ``-cuda-cuda``)."""
        if self.worker_image:
            return self.worker_image
        repository, _, tag = self.image.rpartition(":")
        if repository and "/" not in tag:
            return self.image if tag.endswith("-cuda") else f"{repository}:{tag}-cuda"
        return f"{self.image}:latest-cuda"

    @property
    def pod_cpu(self) -> str:
        return f"{self.cpu_per_gpu * self.gpus_per_worker:g}"

    @property
    def pod_memory(self) -> str:
        return f"{_mib(self.memory_per_gpu_gib * self.gpus_per_worker)}Mi"

    @property
    def pod_shm(self) -> str:
        return f"{_mib(self.shm_per_gpu_gib * self.gpus_per_worker)}Mi"

    def unique(self) -> KubeSpec:
        """This spec under a name of its own: a run owns (and on close deletes) its DaskCluster,
        so two runs must never share one."""
        import dataclasses
        import uuid

        return dataclasses.replace(self, name=f"{self.name}-{uuid.uuid4().hex[:8]}")


def _mib(gib: float) -> int:
    return int(round(gib * 1024))


# The restricted Pod Security Standard: non-root, no privilege escalation, no capabilities,
# the runtime's default seccomp profile (tests/test_k8s_validation.py checks every pod).
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}


def _non_root(container: dict) -> None:
    container["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _writable(pod: dict, container: dict, shm: str | None = None) -> None:
    """A read-only root filesystem with the places Python, Dask and torch write to: /tmp (Dask's
    scratch space, torch's compile caches) and the home directory; ``shm``: a memory-backed /dev/shm."""
    volumes = [("tmp", "/tmp", {"emptyDir": {}}), ("home", "/home/malleable", {"emptyDir": {}})]
    if shm is not None:
        volumes.append(("dshm", "/dev/shm", {"emptyDir": {"medium": "Memory", "sizeLimit": shm}}))
    for name, path, source in volumes:
        pod.setdefault("volumes", []).append({"name": name, **source})
        container.setdefault("volumeMounts", []).append({"name": name, "mountPath": path})


def kube_cluster_spec(spec: KubeSpec) -> dict:
    """The DaskCluster resource (a plain dict; built offline, nothing contacts a cluster)."""
    from dask_kubernetes.operator import make_cluster_spec

    # The worker pod's nanny reads the daemon flag from its environment: restarts stay non-daemonic.
    env = {**TRAINING_WORKER_ENV, **NON_DAEMONIC_ENV, **QUIET_WORKER_ENV, **spec.env}
    if spec.checkpoint_claim is not None:
        env.setdefault("MALLEABLE_CHECKPOINT_DIR", spec.checkpoint_path)
    cluster = copy.deepcopy(make_cluster_spec(name=spec.name, image=spec.image, n_workers=spec.workers, env=env or None))
    cluster["metadata"]["namespace"] = spec.namespace
    worker = cluster["spec"]["worker"]["spec"]["containers"][0]
    worker["image"] = spec.gpu_image
    # One Dask worker per GPU (gpu_worker_args); no memory limit in the nanny: the pod's limit
    # bounds it, and a nanny that restarts a worker over a threshold kills a rank mid-step.
    worker["args"] = gpu_worker_args(spec.gpus_per_worker)
    sized = {K8S_GPU: spec.gpus_per_worker, "cpu": spec.pod_cpu, "memory": spec.pod_memory}
    worker["resources"] = {"limits": dict(sized), "requests": dict(sized)}
    worker["livenessProbe"] = {"httpGet": {"path": "/health", "port": "http-dashboard"}, "initialDelaySeconds": 60, "periodSeconds": 30, "failureThreshold": 4}
    worker["readinessProbe"] = {"httpGet": {"path": "/health", "port": "http-dashboard"}, "periodSeconds": 10}
    if spec.env_secrets:
        worker["envFrom"] = [{"secretRef": {"name": s}} for s in spec.env_secrets]
    _non_root(worker)
    pod = cluster["spec"]["worker"]["spec"]
    _writable(pod, worker, shm=spec.pod_shm)
    if spec.checkpoint_claim is not None:
        pod["volumes"].append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint_claim}})
        worker["volumeMounts"].append({"name": "checkpoints", "mountPath": spec.checkpoint_path})
    pod["tolerations"] = [{"key": K8S_GPU, "operator": "Exists", "effect": "NoSchedule"}]
    # One worker pod per node: it holds all the GPUs the node gives it.
    pod["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"dask.org/cluster-name": spec.name, "dask.org/component": "worker"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
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
    _writable(scheduler_pod, scheduler)
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
