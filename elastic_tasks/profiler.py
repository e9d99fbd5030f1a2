"""Seed 000's Job Scalability Analyzer: measure a recipe into a ``ThroughputProfile``.

Two kinds of figures, as in the paper:

* job-specific — per-iteration time (batch collation + forward + backward + optimizer step,
  collation optional) on one worker
  for a ladder of per-GPU batch sizes, warm-up excluded, median of n; and the largest
  per-GPU batch that fits (probed with out-of-memory errors on CUDA, a setting on CPU);
* generic — allreduce time for p parameters on k workers, measured with real
  ``torch.distributed.all_reduce`` (gloo on CPU, nccl on CUDA) in spawned local processes
  and fitted to the ring model with ``allocator.throughput.fit_allreduce``. It depends on
  the cluster, not the job, so a caller may measure it once and pass it in.

Nothing here knows Prefect; ``profile_cached`` keeps results in a ``ProfileCache`` directory.
"""

from __future__ import annotations

import gc
import json
import math
import platform
import queue
import socket
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from allocator.throughput import fit_allreduce
from allocator.types import AllreduceModel, ThroughputProfile
from elastic_tasks.profile_cache import ProfileCache, ProfileKey
from elastic_tasks.recipe import TrainingRecipe, to_device
from elastic_tasks.step import autocast


class ProfilerError(RuntimeError):
    """A measurement could not be taken (a worker failed or hung, nothing fits in memory)."""


def _positive_ints(owner: str, name: str, values: Sequence[int], minimum: int = 1) -> tuple[int, ...]:
    out = tuple(values)
    if not out:
        raise ValueError(f"{owner}.{name}={out!r}: must not be empty")
    for v in out:
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= minimum):
            raise ValueError(f"{owner}.{name}={out!r}: every value must be an integer >= {minimum}")
    if len(set(out)) != len(out):
        raise ValueError(f"{owner}.{name}={out!r}: values must be distinct")
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """How to profile.

    ``max_batch_per_gpu``: the memory cap. On CPU it is this setting (default: the largest
    ladder batch); on CUDA ``None`` means probe it (up to ``probe_limit``), a number means trust it.
    ``allreduce_gpus``: worker counts to time allreduce on (1 is allowed and skipped: no
    communication). ``allreduce_params``: parameter counts to time (default: an eighth, a
    half and all of the model's trainable parameters). ``threads``: torch intra-op threads
    while measuring (default: leave the process's setting); part of the hardware fingerprint.
    ``include_data``: collate every timed iteration's batch from the data set inside the timed
    region, as the elastic trainer's ranks do — with in-memory or synthetic data that work is on
    the critical path, and a profile without it under-predicts a real step (measured: about
    half of a ``resnet_small`` step on CPU, 48 of 91 ms at batch 128). False gives seed 000's
    pure processing time, right where a loader overlaps it.
    """

    batch_sizes: tuple[int, ...] = (8, 16, 32, 64)
    warmup: int = 2
    repeats: int = 5
    max_batch_per_gpu: int | None = None
    probe_limit: int = 4096
    allreduce_gpus: tuple[int, ...] = (2,)
    allreduce_params: tuple[int, ...] | None = None
    allreduce_repeats: int = 5
    timeout_s: float = 120.0
    device: str = "cpu"
    threads: int | None = None
    include_data: bool = True

    def __post_init__(self) -> None:
        owner = "ProfileSettings"
        object.__setattr__(self, "batch_sizes", _positive_ints(owner, "batch_sizes", self.batch_sizes))
        object.__setattr__(self, "allreduce_gpus", _positive_ints(owner, "allreduce_gpus", self.allreduce_gpus))
        if self.allreduce_params is not None:
            object.__setattr__(self, "allreduce_params", _positive_ints(owner, "allreduce_params", self.allreduce_params))
        for name in ("warmup",):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 0):
                raise ValueError(f"{owner}.{name}={v!r}: must be an integer >= 0")
        for name in ("repeats", "allreduce_repeats", "probe_limit"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"{owner}.{name}={v!r}: must be a positive integer")
        if self.max_batch_per_gpu is not None and not (
            isinstance(self.max_batch_per_gpu, int) and self.max_batch_per_gpu > 0
        ):
            raise ValueError(f"{owner}.max_batch_per_gpu={self.max_batch_per_gpu!r}: must be a positive integer")
        if not isinstance(self.include_data, bool):
            raise ValueError(f"{owner}.include_data={self.include_data!r}: must be true or false")
        if self.threads is not None and not (isinstance(self.threads, int) and not isinstance(self.threads, bool) and self.threads > 0):
            raise ValueError(f"{owner}.threads={self.threads!r}: must be a positive integer")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"{owner}.timeout_s={self.timeout_s!r}: must be a finite number > 0")
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"{owner}.device={self.device!r}: not a torch device") from None
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"{owner}.device={self.device!r}: expected cpu or cuda")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{owner}.device={self.device!r}: CUDA is not available on this machine")

    @property
    def is_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    @property
    def backend(self) -> str:
        return "nccl" if self.is_cuda else "gloo"


@dataclass(frozen=True, slots=True)
class AllreduceSample:
    """One measured allreduce: ``params`` float32 values summed over ``gpus`` workers."""

    params: int
    gpus: int
    seconds: float


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


def trainable_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- compute


def _sample_batch(recipe: TrainingRecipe, batch: int, device: torch.device, start: int = 0) -> Any:
    """``batch`` samples from index ``start`` (cycling a small data set), collated as a rank does, on ``device``."""
    n = len(recipe.dataset)  # type: ignore[arg-type]
    return to_device(recipe.collate([recipe.dataset[(start + i) % n] for i in range(batch)]), device)


class _Stepper:
    """One model and optimizer on one device; ``step(b)`` runs a training iteration at batch b."""

    def __init__(self, recipe: TrainingRecipe, device: torch.device, include_data: bool = False) -> None:
        torch.manual_seed(0)
        self.recipe = recipe
        self.device = device
        self.include_data = include_data
        self._cursor = 0  # where the next fresh batch starts, so no two steps reuse one
        self.model = recipe.build_model().to(device).train()
        self.optimizer = recipe.make_optimizer(self.model.parameters(), recipe.base_lr)
        self._batches: dict[int, Any] = {}

    def batch(self, b: int) -> Any:
        if b not in self._batches:
            self._batches = {b: _sample_batch(self.recipe, b, self.device)}  # hold one size at a time
        return self._batches[b]

    def step(self, b: int) -> None:
        if self.include_data:
            data = _sample_batch(self.recipe, b, self.device, self._cursor)
            self._cursor += b
        else:
            data = self.batch(b)
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.recipe.precision, self.device):  # the precision the ranks train in
            loss, _ = self.recipe.loss(self.model, data)
        loss.float().backward()
        self.optimizer.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def release(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._batches = {}
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def time_iterations(stepper: _Stepper, batch: int, warmup: int, repeats: int) -> float:
    """Median seconds of one forward+backward+step at ``batch``, after ``warmup`` untimed steps.

    Data preparation is inside the timed region only when the stepper was built with
    ``include_data`` (seed 000's t_proc is processing time; our ranks also collate).
    """
    if not stepper.include_data:
        stepper.batch(batch)
    for _ in range(warmup):
        stepper.step(batch)
    stepper.sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        stepper.step(batch)
        stepper.sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def monotone_envelope(times: Sequence[float]) -> tuple[float, ...]:
    """Running maximum: a profile may not claim a larger batch is faster.

    On small models timing noise can make b=16 measure a hair under b=8; the profile type
    refuses that, so the envelope keeps the slower figure (raw times stay in the report).
    """
    out: list[float] = []
    for t in times:
        out.append(max(t, out[-1]) if out else t)
    return tuple(out)


def largest_fitting_batch(fits: Callable[[int], bool], start: int, limit: int) -> int:
    """The largest b in [start, limit] with ``fits(b)``, assuming fitting is monotone in b.

    Doubles from ``start`` until a batch fails (or ``limit``), then bisects between the last
    success and the first failure: O(log limit) trial iterations.
    """
    if not (0 < start <= limit):
        raise ValueError(f"largest_fitting_batch: start={start!r} must lie in [1, limit={limit}]")
    if not fits(start):
        raise ProfilerError(f"batch_per_gpu={start}: does not fit in device memory")
    good, bad = start, None
    while bad is None and good < limit:
        trial = min(2 * good, limit)
        if fits(trial):
            good = trial
        else:
            bad = trial
    if bad is None:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def _cuda_fits(stepper: _Stepper) -> Callable[[int], bool]:
    def fits(b: int) -> bool:
        try:
            stepper.step(b)
            stepper.sync()
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            stepper.release()

    return fits


# --------------------------------------------------------------------------- allreduce


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _allreduce_worker(
    rank: int,
    world: int,
    port: int,
    backend: str,
    params: tuple[int, ...],
    repeats: int,
    timeout_s: float,
    results: mp.Queue,
) -> None:
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        out = []
        warm = torch.ones(1, device=device)
        for _ in range(3):  # the first collectives on a new group pay for connection set-up
            dist.all_reduce(warm)
        for p in params:
            buf = torch.ones(p, dtype=torch.float32, device=device)
            for _ in range(2):  # the first uses of a size allocate buffers
                dist.all_reduce(buf)
            times = []
            for _ in range(repeats):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                dist.all_reduce(buf)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - start)
            # The slowest rank decides when the step can go on.
            t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out.append((p, float(t.item())))
        if rank == 0:
            results.put(("ok", out))
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which raises ProfilerError
        results.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))


def measure_allreduce(
    param_counts: Sequence[int],
    world_sizes: Sequence[int],
    *,
    backend: str = "gloo",
    repeats: int = 5,
    timeout_s: float = 120.0,
) -> tuple[AllreduceSample, ...]:
    """Time ``all_reduce`` of float32 buffers of each size on each local world size.

    Each world size is a fresh set of spawned processes rendezvousing over TCP on
    localhost; init and every collective carry ``timeout_s``, and the parent kills any
    process still alive after the deadline, so a hang becomes a ``ProfilerError``.
    """
    params = _positive_ints("measure_allreduce", "param_counts", param_counts)
    worlds = _positive_ints("measure_allreduce", "world_sizes", world_sizes)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"measure_allreduce.backend={backend!r}: expected gloo or nccl")
    if backend == "nccl" and max(worlds) > torch.cuda.device_count():
        raise ValueError(f"measure_allreduce.world_sizes={worlds!r}: only {torch.cuda.device_count()} CUDA devices")
    if mp.current_process().daemon and any(k > 1 for k in worlds):
        raise ProfilerError(
            "measure_allreduce: this process is daemonic (a Dask worker?) and cannot spawn ranks; "
            "measure allreduce elsewhere and pass the fit in"
        )
    samples: list[AllreduceSample] = []
    ctx = mp.get_context("spawn")
    for k in worlds:
        if k == 1:
            continue  # no communication on one worker
        results = ctx.Queue()
        port = _free_port()
        procs = [
            ctx.Process(target=_allreduce_worker, args=(r, k, port, backend, params, repeats, timeout_s, results), daemon=True)
            for r in range(k)
        ]
        for p in procs:
            p.start()
        try:
            deadline = time.monotonic() + timeout_s + 60.0  # spawning and importing torch take a while
            status, payload = _await_result(results, procs, deadline)
        finally:
            _reap(procs)
        if status != "ok":
            raise ProfilerError(f"allreduce on {k} workers failed: {payload}")
        samples.extend(AllreduceSample(p, k, s) for p, s in payload)
    return tuple(samples)


def _await_result(results: mp.Queue, procs: list, deadline: float) -> tuple[str, object]:
    while True:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            pass
        if time.monotonic() > deadline:
            return "error", "timed out"
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            try:  # the failing rank usually queued its reason just before dying
                return results.get(timeout=1.0)
            except queue.Empty:
                return "error", f"process exited with code {dead[0].exitcode}"


def _reap(procs: list) -> None:
    for p in procs:
        p.join(timeout=5.0)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)


# --------------------------------------------------------------------------- profile


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
    stepper = _Stepper(recipe, device, settings.include_data)
    num_params = trainable_params(stepper.model)

    if settings.max_batch_per_gpu is not None:
        cap = settings.max_batch_per_gpu
    elif settings.is_cuda:
        cap = largest_fitting_batch(_cuda_fits(stepper), settings.batch_sizes[0], settings.probe_limit)
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
