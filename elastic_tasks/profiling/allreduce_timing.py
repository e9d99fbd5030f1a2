"""The generic figure: allreduce time for p parameters on k workers.

Measured with real ``torch.distributed.all_reduce`` (gloo on CPU, nccl on CUDA) in local
processes forked from multiprocessing's fork server (``elastic_tasks.forking``);
``allocator.physics.throughput.fit_allreduce`` fits the samples to the ring model.
It depends on the cluster, not the job, so a caller may measure it once and pass the fit in.
"""

from __future__ import annotations

import queue
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from elastic_tasks.forking import forkserver_context
from elastic_tasks.profiling.settings import ProfilerError, positive_ints


# What a rank imports, loaded once in the fork server: spawned, each rank imported torch afresh
# (two ranks: 3.7 CPU-s and 2 s a measurement on the 2-core box; forked, 0.07 s once the server
# runs, ~1.5 s the first time in a process, which starts it).
RANK_PRELOAD = ("torch", "torch.distributed", __name__)


@dataclass(frozen=True, slots=True)
class AllreduceSample:
    """One measured allreduce: ``params`` float32 values summed over ``gpus`` workers."""

    params: int
    gpus: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _Measured:
    """Rank 0's answer to the parent: one sample per parameter count."""

    samples: tuple[AllreduceSample, ...]


@dataclass(frozen=True, slots=True)
class _Failed:
    """Why a world produced no samples (a rank's exception, a timeout, a dead process)."""

    reason: str


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
            out.append(AllreduceSample(p, world, float(t.item())))
        if rank == 0:
            results.put(_Measured(tuple(out)))
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which raises ProfilerError
        results.put(_Failed(f"rank {rank}: {type(exc).__name__}: {exc}"))


def measure_allreduce(
    param_counts: Sequence[int],
    world_sizes: Sequence[int],
    *,
    backend: str = "gloo",
    repeats: int = 5,
    timeout_s: float = 120.0,
) -> tuple[AllreduceSample, ...]:
    """Time ``all_reduce`` of float32 buffers of each size on each local world size.

    Each world size is a fresh set of processes (forked from the fork server) rendezvousing over TCP on
    localhost; init and every collective carry ``timeout_s``, and the parent kills any
    process still alive after the deadline, so a hang becomes a ``ProfilerError``.
    """
    params = positive_ints("measure_allreduce", "param_counts", param_counts)
    worlds = positive_ints("measure_allreduce", "world_sizes", world_sizes)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"measure_allreduce.backend={backend!r}: expected gloo or nccl")
    if backend == "nccl" and max(worlds) > torch.cuda.device_count():
        raise ValueError(f"measure_allreduce.world_sizes={worlds!r}: only {torch.cuda.device_count()} CUDA devices")
    if mp.current_process().daemon and any(k > 1 for k in worlds):
        raise ProfilerError(
            "measure_allreduce: this process is daemonic (a Dask worker?) and cannot start rank processes; "
            "measure allreduce elsewhere and pass the fit in"
        )
    samples: list[AllreduceSample] = []
    ctx = forkserver_context(RANK_PRELOAD)
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
            deadline = time.monotonic() + timeout_s + 60.0  # starting the fork server (importing torch) takes a while
            outcome = _await_result(results, procs, deadline)
        finally:
            _reap(procs)
        if isinstance(outcome, _Failed):
            raise ProfilerError(f"allreduce on {k} workers failed: {outcome.reason}")
        samples.extend(outcome.samples)
    return tuple(samples)


def _await_result(results: mp.Queue, procs: list, deadline: float) -> _Measured | _Failed:
    while True:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            pass
        if time.monotonic() > deadline:
            return _Failed("timed out")
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            try:  # the failing rank usually queued its reason just before dying
                return results.get(timeout=1.0)
            except queue.Empty:
                return _Failed(f"process exited with code {dead[0].exitcode}")


def _reap(procs: list) -> None:
    for p in procs:
        p.join(timeout=5.0)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)
