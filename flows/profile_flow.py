"""The ``profile`` flow: measure a recipe into a ThroughputProfile, cached by model and hardware.

The Prefect cache key is (entry point, hardware fingerprint, how it was measured): the same
model on the same machine is measured once and every later flow run — a retrain tonight, a
cluster run tomorrow — reuses the stored result. A new machine or a new ladder measures anew.

Where it is measured: ``profile_flow`` measures in this process on the device this machine's
ranks would use (its GPU when CUDA is here, else the CPU with one thread, as a rank trains);
``profile_on_workers`` measures on one GPU worker of a running cluster, keyed by *that*
worker's fingerprint — what a flow with a cluster in hand uses, since the ranks run there,
not here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from datetime import timedelta

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from distributed import Client

from allocator.profiles.io import profile_from_dict, profile_to_dict
from allocator.physics.throughput import fit_allreduce
from allocator.types import AllreduceModel, ThroughputProfile
from elastic_tasks.profiling.allreduce_timing import measure_allreduce
from elastic_tasks.devices import default_backend, rank_device
from elastic_tasks.profiling.on_workers import WorkerIdentity, submit_identity, submit_profile
from elastic_tasks.profiling.settings import ProfileSettings
from elastic_tasks.profiling.profiler import default_allreduce_params, hardware_fingerprint, profile_recipe
from elastic_tasks.recipe import load_entry_point
from flows.recording.artifacts import artifact_key


def profile_cache_key(entrypoint: str, settings: ProfileSettings, allreduce: AllreduceModel | None) -> str:
    what = {
        "model": entrypoint,
        "hardware": hardware_fingerprint(settings.device),
        "settings": asdict(settings),
        "allreduce": None if allreduce is None else [allreduce.latency_s, allreduce.seconds_per_param],
    }
    return "profile-" + hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _cache_key_fn(context: object, parameters: dict) -> str:
    return profile_cache_key(parameters["entrypoint"], parameters["settings"], parameters.get("allreduce"))


@task(name="measure-profile", cache_key_fn=_cache_key_fn, persist_result=True, cache_expiration=timedelta(days=30), retries=1, retry_delay_seconds=5)
def measure_profile(entrypoint: str, settings: ProfileSettings, allreduce: AllreduceModel | None = None) -> dict:
    """Runs only on a cache miss; the result (the profile as JSON) is persisted in Prefect's
    local result storage (``PREFECT_LOCAL_STORAGE_PATH``) for later runs."""
    report = profile_recipe(load_entry_point(entrypoint), settings, allreduce=allreduce)
    return profile_to_dict(report.profile)


def _worker_cache_key_fn(context: object, parameters: dict) -> str:
    return "profile-worker-" + hashlib.sha256(parameters["identity"].key.encode()).hexdigest()[:24]


@task(name="measure-profile-on-worker", cache_key_fn=_worker_cache_key_fn, persist_result=True, cache_expiration=timedelta(days=30), retries=1, retry_delay_seconds=5)
def measure_profile_on_worker(client: Client, entrypoint: str, settings: ProfileSettings, identity: WorkerIdentity) -> dict:
    """On a cache miss: the allreduce prior here (Dask workers are daemonic and may not spawn the
    processes a collective needs; the online refit corrects it from the job's own steps), then
    the compute profile on one GPU worker."""
    counts = settings.allreduce_params or default_allreduce_params(identity.num_params)
    samples = measure_allreduce(counts, settings.allreduce_gpus, repeats=settings.allreduce_repeats, timeout_s=settings.timeout_s)
    allreduce = fit_allreduce([(x.params, x.gpus, x.seconds) for x in samples])
    return profile_to_dict(submit_profile(client, entrypoint, settings, allreduce).result().profile)


def profile_on_workers(
    client: Client, entrypoint: str, batch_sizes: list[int] | None = None, repeats: int = 5, warmup: int = 2, refresh: bool = False
) -> ThroughputProfile:
    """Profile ``entrypoint`` on a GPU worker of ``client``'s cluster as its ranks train there
    (device, one thread, the recipe's precision), cached by that worker's hardware."""
    settings = ProfileSettings(threads=1, batch_sizes=tuple(batch_sizes or (8, 16, 32, 64)), allreduce_gpus=(2,), repeats=repeats, warmup=warmup)
    identity = submit_identity(client, entrypoint, settings).result()
    data = measure_profile_on_worker.with_options(refresh_cache=refresh)(client, entrypoint, settings, identity)
    profile = profile_from_dict(data, f"profile of {entrypoint}")
    remember(profile, settings)
    _publish(entrypoint, profile)
    return profile


def remember(profile: ThroughputProfile, how: ProfileSettings) -> None:
    """Keep the profile in the state directory's profile cache too, where `malleable submit`, the
    Python client and `malleable profile` look: a job submitted after tonight's retrain plans with
    what the retrain measured, not with a prior (Prefect's result cache is this flow's alone)."""
    from elastic_tasks.profiling.cache import ProfileCache, ProfileKey
    from flows.config.settings import load_settings

    what = json.dumps(asdict(how), sort_keys=True, default=str)
    ProfileCache(load_settings().profile_cache_dir).put(ProfileKey(profile.workload, profile.hardware, what), profile)


def local_ranks_device() -> str:
    """The device a rank started on this machine trains on: its first GPU, else the CPU."""
    return str(rank_device(default_backend()))


def _publish(entrypoint: str, profile: ThroughputProfile) -> None:
    create_table_artifact(
        key=artifact_key("profile", profile.workload),
        table=[{"per_gpu_batch": b, "iter_time_ms": f"{t * 1000:.2f}", "samples_per_s": f"{b / t:.0f}"} for b, t in zip(profile.batch_sizes, profile.iter_times_s)],
        description=f"{entrypoint} on {profile.hardware}: {profile.num_params} params, allreduce {profile.allreduce.latency_s * 1e3:.2f} ms + {profile.allreduce.seconds_per_param * 1e9:.3f} ns/param",
    )


@flow(name="profile", log_prints=True)
def profile_flow(
    entrypoint: str,
    batch_sizes: list[int] | None = None,
    allreduce_gpus: list[int] | None = None,
    repeats: int = 5,
    warmup: int = 2,
    device: str | None = None,
    allreduce: AllreduceModel | None = None,
    threads: int | None = 1,
    include_data: bool = True,
    refresh: bool = False,
) -> ThroughputProfile:
    """Profile ``entrypoint`` (cached by model + hardware + settings) and publish it as a table.

    ``threads=1`` and ``include_data`` match the elastic trainer's ranks (one torch thread per
    GPU worker, each step collates its own batch); ``device`` None is the device this machine's
    ranks use (``local_ranks_device``). ``refresh`` measures anew and replaces the cached profile.
    """
    settings = ProfileSettings(
        threads=threads,
        batch_sizes=tuple(batch_sizes or (8, 16, 32, 64)),
        allreduce_gpus=tuple(allreduce_gpus or (2,)),
        repeats=repeats,
        warmup=warmup,
        device=device or local_ranks_device(),
        include_data=include_data,
    )
    data = measure_profile.with_options(refresh_cache=refresh)(entrypoint, settings, allreduce)
    profile = profile_from_dict(data, f"profile of {entrypoint}")
    remember(profile, settings)
    _publish(entrypoint, profile)
    return profile
