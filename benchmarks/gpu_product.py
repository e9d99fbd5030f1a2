"""The product on the lent GPUs (issue 22.5): the rank loop of ``malleable train``, nccl, real rescales.

Each run goes through the same path as ``malleable train`` (``flows/commands/train._run``):
``local_gpu_cluster`` (one worker per GPU, each seeing its own device first), ``warm_up``, a
``JobCoordinator`` that starts the ranks and rescales them in place. What it adds is the
measurement: the pause of every generation change, each worker's peak memory (CUDA's
``max_memory_allocated`` on a GPU, the process's peak RSS on CPU) and, for a killed rank,
the recovery's pause and the steps it lost.

On CPU the same runs use gloo on virtual GPUs (a short smoke of the product path); what only
a GPU can show (nccl, CUDA memory) is listed under ``skipped_parts``.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Run:
    entry: str
    steps: int
    batch: int
    backend: str  # nccl on GPUs, gloo on CPU


def _reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_bytes() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _train(run: Run, gpus: int, workers: int, rescales: tuple[int, ...] = (), kill_at: int | None = None):  # noqa: ANN202
    from distributed import Client

    from deploy.local import local_gpu_cluster
    from elastic_tasks.cluster import WorkerPool, warm_up
    from elastic_tasks.coordinator.job import JobCoordinator
    from elastic_tasks.protocol import TrainConfig

    config = TrainConfig(global_batch=run.batch, max_steps=run.steps, backend=run.backend, timeout_s=30.0, evaluate=False)
    with local_gpu_cluster(workers) as cluster, Client(cluster) as client:
        client.wait_for_workers(workers, timeout=180)
        warm_up(client, run.entry)
        client.run(_reset_peak)
        job = JobCoordinator(client, WorkerPool(client), f"gpu-validation-{time.monotonic_ns()}", run.entry, config)
        try:
            job.start(gpus)
            for target in rescales:  # each as soon as its new ranks are ready; blocks until applied
                job.rescale(target)
            if kill_at is not None:
                while (s := job.status()) is None or s.step < kill_at:
                    time.sleep(0.05)
                victim = job.members[-1]
                addr = job.worker_of[victim]
                os.kill(client.run(os.getpid, workers=[addr])[addr], signal.SIGKILL)
            result = job.wait(900)
            peaks = {addr: v for addr, v in client.run(_peak_bytes).items()}
        finally:
            job.close()
            job.board.forget()
    return result, peaks


def elastic_in_place(run: Run, gpus: int) -> dict[str, object]:
    """1 -> 2 -> 1 in place (2 -> 4 -> 2 with 4 GPUs): every change's pause, the workers' peak memory."""
    low, high = (2, 4) if gpus >= 4 else (1, 2)
    result, peaks = _train(run, low, high, rescales=(high, low))
    return {
        "plan": f"{low}->{high}->{low}",
        "steps": result.steps,
        "samples": result.samples_seen,
        "pause_s": [round(r.pause_s, 3) if r.pause_s is not None else None for r in result.rescales[1:]],
        "peak_mem_mib_max": round(max(peaks.values()) / 2**20, 1),
        "peak_mem_kind": "cuda_max_memory_allocated" if torch.cuda.is_available() else "process_peak_rss",
    }


def killed_rank(run: Run, ranks: int) -> dict[str, object]:
    """``ranks`` ranks, the last one killed mid-run: the survivors' pause and the steps lost."""
    result, _ = _train(run, ranks, ranks, kill_at=max(2, run.steps // 3))
    rec = result.recoveries[0] if result.recoveries else None
    return {
        "finished": result.finished,
        "steps": result.steps,
        "samples_exact": result.samples_seen == run.steps * run.batch,
        "recoveries": len(result.recoveries),
        "survivors": len(rec.survivors) if rec else 0,
        "pause_s": round(rec.pause_s, 3) if rec and rec.pause_s is not None else None,
        "steps_lost": rec.steps_lost if rec else None,
    }


def restart_rescale(run: Run, at_step: int) -> dict[str, object]:
    """One rank whose worker process is restarted at ``at_step`` (checkpoint-restart at the same
    size, the path that needs no second GPU): the pause, and the peak memory of the process
    before the restart and of the fresh one after it (CUDA's allocator peak on a GPU)."""
    import tempfile

    from distributed import Client

    from deploy.local import local_gpu_cluster
    from elastic_tasks.cluster import WorkerPool, warm_up
    from elastic_tasks.coordinator.job import JobCoordinator
    from elastic_tasks.protocol import TrainConfig

    with tempfile.TemporaryDirectory() as ckpt, local_gpu_cluster(1) as cluster, Client(cluster) as client:
        # The ranks wait at at_step for the plan (as `malleable train --rescale-at` makes them): a
        # fast job cannot finish before the restart is published.
        config = TrainConfig(
            global_batch=run.batch, max_steps=run.steps, backend=run.backend, timeout_s=60.0, evaluate=False, checkpoint_dir=ckpt,
            hold_at_steps=frozenset({at_step}),
        )
        client.wait_for_workers(1, timeout=180)
        warm_up(client, run.entry)
        client.run(_reset_peak)
        job = JobCoordinator(client, WorkerPool(client), f"gpu-restart-{time.monotonic_ns()}", run.entry, config)
        try:
            job.start(1)
            while (s := job.status()) is None or s.step < at_step // 2:
                time.sleep(0.05)
            before = max(client.run(_peak_bytes).values())
            outcome = job.restart_rescale(1, at_step=at_step)
            result = job.wait(900)
            after = max(client.run(_peak_bytes).values())
        finally:
            job.close()
            job.board.forget()
    return {
        "finished": result.finished,
        "samples_exact": result.samples_seen == run.steps * run.batch,
        "pause_s": round(outcome.pause_s, 3) if outcome is not None and outcome.pause_s is not None else None,
        "peak_mem_mib_before": round(before / 2**20, 1),
        "peak_mem_mib_after": round(after / 2**20, 1),
        "peak_mem_kind": "cuda_max_memory_allocated" if torch.cuda.is_available() else "process_peak_rss",
    }
