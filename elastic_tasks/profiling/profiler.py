"""Seed 000's Job Scalability Analyzer: measure a recipe into a ``ThroughputProfile``.

Two kinds of figures, as in the paper:

* job-specific — per-iteration time (batch collation + forward + backward + optimizer step,
  collation optional) on one worker
  for a ladder of per-GPU batch sizes, warm-up excluded, median of n; and the largest
  per-GPU batch that fits (probed with out-of-memory errors on CUDA, a setting on CPU)
  — ``elastic_tasks.profiling.iteration_timing``;
* generic — allreduce time for p parameters on k workers, measured with real
  ``torch.distributed.all_reduce`` and fitted to the ring model — ``elastic_tasks.profiling.allreduce_timing``.
  It depends on the cluster, not the job, so a caller may measure it once and pass it in.

This module puts them together into a profile. Nothing here knows Prefect;
``profile_cached`` keeps results in a ``ProfileCache`` directory.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from allocator.profiles.io import monotone_envelope
from allocator.physics.throughput import fit_allreduce
from allocator.types import AllreduceModel, ThroughputProfile
from elastic_tasks.profiling.allreduce_timing import AllreduceSample, measure_allreduce
from elastic_tasks.profiling.iteration_timing import Stepper, cuda_fits, largest_fitting_batch, time_iterations, trainable_params
from elastic_tasks.profiling.cache import ProfileCache, ProfileKey
from elastic_tasks.profiling.settings import ProfileSettings
from elastic_tasks.recipe import TrainingRecipe


@dataclass(frozen=True, slots=True)
class ProfileReport:
    """A profile plus what it was built from (raw times before the monotone envelope).

    A cache hit carries no raw measurements: ``raw_iter_times_s`` is then the stored
    (enveloped) profile times and ``allreduce_samples`` is empty.
    """

    profile: ThroughputProfile
    raw_iter_times_s: tuple[float, ...]
    allreduce_samples: tuple[AllreduceSample, ...] = ()
    from_cache: bool = False


def hardware_fingerprint(device: str = "cpu") -> str:
    """What a profile's figures depend on: the device model, threads, torch version."""
    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        return f"cuda:{name}|torch={torch.__version__}|cuda={torch.version.cuda}"
    return f"cpu:{_cpu_model()}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def default_allreduce_params(num_params: int) -> tuple[int, ...]:
    return tuple(sorted({max(1, num_params // 8), max(1, num_params // 2), num_params}))


def profile_recipe(
    recipe: TrainingRecipe,
    settings: ProfileSettings = ProfileSettings(),
    *,
    allreduce: AllreduceModel | None = None,
) -> ProfileReport:
    """Measure ``recipe`` into a ``ThroughputProfile``.

    ``allreduce``: a cluster-wide fit measured earlier (seed 000 measures it once per
    cluster); when given, no allreduce is timed here.
    """
    with _intra_op_threads(settings.threads):
        return _profile_recipe(recipe, settings, allreduce)


@contextmanager
def _intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` torch threads, then restore the caller's setting."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _profile_recipe(recipe: TrainingRecipe, settings: ProfileSettings, allreduce: AllreduceModel | None) -> ProfileReport:
    device = torch.device(settings.device)
    stepper = Stepper(recipe, device, settings.include_data)
    num_params = trainable_params(stepper.model)

    if settings.max_batch_per_gpu is not None:
        cap = settings.max_batch_per_gpu
    elif settings.is_cuda:
        cap = largest_fitting_batch(cuda_fits(stepper), settings.batch_sizes[0], settings.probe_limit)
    else:
        cap = settings.batch_sizes[-1]
    ladder = tuple(b for b in settings.batch_sizes if b <= cap)
    if not ladder:
        raise ValueError(
            f"ProfileSettings.batch_sizes={settings.batch_sizes!r}: none fits max_batch_per_gpu={cap}"
        )
    raw = tuple(time_iterations(stepper, b, settings.warmup, settings.repeats) for b in ladder)
    stepper.release()

    samples: tuple[AllreduceSample, ...] = ()
    if allreduce is None:
        counts = settings.allreduce_params or default_allreduce_params(num_params)
        samples = measure_allreduce(
            counts,
            settings.allreduce_gpus,
            backend=settings.backend,
            repeats=settings.allreduce_repeats,
            timeout_s=settings.timeout_s,
        )
        allreduce = fit_allreduce([(s.params, s.gpus, s.seconds) for s in samples])

    profile = ThroughputProfile(
        workload=recipe.name,
        num_params=num_params,
        batch_sizes=ladder,
        iter_times_s=monotone_envelope(raw),
        max_batch_per_gpu=cap,
        allreduce=allreduce,
        hardware=hardware_fingerprint(settings.device),
    )
    return ProfileReport(profile=profile, raw_iter_times_s=raw, allreduce_samples=samples)


def cache_key(recipe: TrainingRecipe, settings: ProfileSettings, allreduce: AllreduceModel | None = None) -> ProfileKey:
    """What a cached profile must match: the workload, this hardware, and how it was measured."""
    measured = {
        "batch_sizes": list(settings.batch_sizes),
        "warmup": settings.warmup,
        "repeats": settings.repeats,
        "max_batch_per_gpu": settings.max_batch_per_gpu,
        "probe_limit": settings.probe_limit if settings.max_batch_per_gpu is None else None,
        "include_data": settings.include_data,
        "precision": recipe.precision,  # bf16/fp16 autocast changes every figure
        "allreduce": (
            [allreduce.latency_s, allreduce.seconds_per_param]
            if allreduce is not None
            else {
                "gpus": list(settings.allreduce_gpus),
                "params": None if settings.allreduce_params is None else list(settings.allreduce_params),
                "repeats": settings.allreduce_repeats,
            }
        ),
    }
    with _intra_op_threads(settings.threads):
        hardware = hardware_fingerprint(settings.device)
    return ProfileKey(recipe.name, hardware, json.dumps(measured, sort_keys=True))


def profile_cached(
    recipe: TrainingRecipe,
    settings: ProfileSettings,
    cache: ProfileCache | None,
    *,
    allreduce: AllreduceModel | None = None,
    refresh: bool = False,
) -> ProfileReport:
    """``profile_recipe`` behind ``cache``: a hit returns the stored profile without measuring."""
    key = cache_key(recipe, settings, allreduce)
    if cache is not None and not refresh:
        hit = cache.get(key)
        if hit is not None:
            return ProfileReport(profile=hit, raw_iter_times_s=hit.iter_times_s, from_cache=True)
    report = profile_recipe(recipe, settings, allreduce=allreduce)
    if cache is not None:
        cache.put(key, report.profile)
    return report
