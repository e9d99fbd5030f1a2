"""Run the profiler on a Dask worker: the job is measured where it will train.

The task loads the entry point on the worker (recipes need not pickle from the client),
honours a cache directory the worker can see, and asks for one ``GPU`` resource so it
runs alone on a GPU worker (on CPU clusters the resource is virtual).

Dask's nanny starts workers as daemonic processes, which may not spawn children, so a
worker cannot time allreduce itself; pass the cluster's allreduce fit (seed 000 measures it
once per cluster, not per job — ``allreduce_timing.measure_allreduce`` from the client side).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from distributed import Client, Future

from allocator.types import AllreduceModel
from elastic_tasks.devices import GPU_RESOURCE, default_backend
from elastic_tasks.profiling.cache import ProfileCache
from elastic_tasks.profiling.iteration_timing import trainable_params
from elastic_tasks.profiling.settings import ProfileSettings
from elastic_tasks.profiling.profiler import ProfileReport, cache_key, profile_cached
from elastic_tasks.recipe import load_entry_point


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """What a GPU worker says about profiling there: the cache key of a profile measured as its
    ranks train (its device, threads, precision, this torch) and the model's trainable parameters
    (what the allreduce prior is measured at)."""

    key: str
    num_params: int


def worker_identity(entrypoint: str, settings: ProfileSettings) -> WorkerIdentity:
    """Runs on the worker: nothing is measured, the recipe is built to name the profile."""
    recipe = load_entry_point(entrypoint)
    ranks = as_ranks_run(settings)
    key = cache_key(recipe, ranks)
    return WorkerIdentity(f"{key.workload}|{key.hardware}|{key.settings}", trainable_params(recipe.build_model()))


def submit_identity(client: Client, entrypoint: str, settings: ProfileSettings, resources: dict[str, float] | None = None) -> Future:
    return client.submit(worker_identity, entrypoint, settings, resources={GPU_RESOURCE: 1} if resources is None else resources, pure=False)


def profile_entry_point(
    entrypoint: str,
    settings: ProfileSettings,
    allreduce: AllreduceModel,
    cache_dir: str | None = None,
) -> ProfileReport:
    """What the worker runs: load, then profile behind the cache (idempotent: a re-run hits it)."""
    recipe = load_entry_point(entrypoint)
    cache = None if cache_dir is None else ProfileCache(Path(cache_dir))
    return profile_cached(recipe, as_ranks_run(settings), cache, allreduce=allreduce)


def as_ranks_run(settings: ProfileSettings, threads: int = 1) -> ProfileSettings:
    """The settings a rank on this worker would train with: its device and its intra-op threads.

    The client may have no GPU (it cannot even name ``cuda`` in settings it builds); a rank
    on a GPU worker trains on ``cuda:0`` of its view (``devices.rank_device``) with
    ``TrainConfig.torch_threads`` threads, so the profile measures that. An explicit thread
    count in ``settings`` wins.
    """
    device = "cuda:0" if default_backend() == "nccl" else settings.device
    return dataclasses.replace(settings, device=device, threads=settings.threads or threads)


def submit_profile(
    client: Client,
    entrypoint: str,
    settings: ProfileSettings,
    allreduce: AllreduceModel,
    *,
    cache_dir: Path | str | None = None,
    resources: dict[str, float] | None = None,
) -> Future:
    """Submit ``profile_entry_point`` to one worker holding ``resources`` (default ``{"GPU": 1}``)."""
    return client.submit(
        profile_entry_point,
        entrypoint,
        settings,
        allreduce,
        None if cache_dir is None else str(cache_dir),
        resources={GPU_RESOURCE: 1} if resources is None else resources,
        pure=False,  # timings differ run to run; the cache, not Dask, decides reuse
    )
