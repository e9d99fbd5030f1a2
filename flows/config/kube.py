"""The Kubernetes Dask cluster the settings describe (``MALLEABLE_KUBE_*``), for every flow and command."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flows.config.settings import Settings

if TYPE_CHECKING:
    from deploy.clusters import KubeSpec


def kube_spec(settings: Settings, gpu_workers: int) -> KubeSpec:
    """Worker pods of ``kube_gpus_per_pod`` GPUs each, as many as ``gpu_workers`` GPUs need (whole
    nodes: 10 GPUs on 8-GPU nodes are two pods, 16 GPUs), sized per GPU from the settings."""
    from deploy.clusters import KubeSpec

    per_pod = settings.kube_gpus_per_pod
    env = dict(settings.worker_env)
    if settings.checkpoint_dir is not None and "://" in settings.checkpoint_dir:
        env["MALLEABLE_CHECKPOINT_DIR"] = settings.checkpoint_dir  # an object store: every pod names it the same way
    # The claim is mounted where the settings put checkpoints (a path then; Settings checks it).
    kwargs = {"checkpoint_path": settings.checkpoint_dir} if settings.kube_checkpoint_claim and settings.checkpoint_dir else {}
    return KubeSpec(
        namespace=settings.kube_namespace,
        image=settings.kube_image,
        worker_image=settings.kube_gpu_image,
        workers=-(-gpu_workers // per_pod),
        gpus_per_worker=per_pod,
        cpu_per_gpu=settings.kube_cpu_per_gpu,
        memory_per_gpu_gib=settings.kube_memory_per_gpu_gib,
        shm_per_gpu_gib=settings.kube_shm_per_gpu_gib,
        env=env,
        checkpoint_claim=settings.kube_checkpoint_claim,
        env_secrets=(settings.kube_env_secret,) if settings.kube_env_secret else (),
        **kwargs,  # type: ignore[arg-type]
    )
