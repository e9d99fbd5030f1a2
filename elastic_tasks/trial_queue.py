"""A stage's trials as elastic jobs on Dask workers: at most ``parallel`` run at once, each on
``gpus_per_trial`` workers; the rest queue in trial order and start as others finish.

No Prefect here: the ``hpo`` flow wraps ``run_trials`` in a task and records what it returns.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from distributed import Client

from allocator.hpo.selection import trial_score
from elastic_tasks.cluster import WorkerPool
from elastic_tasks.coordinator import JobCoordinator
from elastic_tasks.protocol import StepRecord, TrainConfig

POLL_S = 0.1  # how often the queue looks for finished trials
RESULT_TIMEOUT_S = 60.0  # a finished trial's result must arrive within this


@dataclass(frozen=True, slots=True)
class TrialLaunch:
    """What starts one trial's job in a stage: its Dask job name, entry point and config."""

    trial: int
    job_name: str
    entry: str
    config: TrainConfig


@dataclass(frozen=True, slots=True)
class TrialRun:
    """One trial's run in one stage, as measured (times in seconds from the run's t0)."""

    trial: int
    stage: int
    gpus: int
    start_s: float
    end_s: float
    steps: int
    eval_loss: float | None
    final_loss: float | None
    history: tuple[StepRecord, ...]
    checkpoint_dir: str | None

    @property
    def score(self) -> float:
        return trial_score(self.eval_loss, self.final_loss)


def run_trials(
    client: Client, stage: int, launches: Sequence[TrialLaunch], parallel: int, gpus_per_trial: int, t0: float, timeout_s: float
) -> list[TrialRun]:
    """Run every launch, ``parallel`` at a time; TimeoutError (after stopping what runs) if the
    stage is not done within ``timeout_s``."""
    if parallel < 1:
        raise ValueError(f"parallel={parallel}: must be >= 1")
    pool = WorkerPool(client)
    queue = list(launches)
    running: dict[int, tuple[JobCoordinator, float, str | None]] = {}
    out: list[TrialRun] = []
    deadline = time.monotonic() + timeout_s
    while queue or running:
        while queue and len(running) < parallel:
            launch = queue.pop(0)
            job = JobCoordinator(client, pool, launch.job_name, launch.entry, launch.config)
            start = time.monotonic() - t0
            job.start(gpus_per_trial)
            running[launch.trial] = (job, start, launch.config.checkpoint_dir)
        finished = [k for k, (job, _, _) in running.items() if job.finished]
        for k in finished:
            job, start, ckpt = running.pop(k)
            result = job.wait(timeout=RESULT_TIMEOUT_S)
            end = time.monotonic() - t0
            out.append(TrialRun(k, stage, gpus_per_trial, start, end, result.steps, result.eval_loss, result.final_loss, result.history, ckpt))
        if not finished:
            if time.monotonic() > deadline:
                for job, _, _ in running.values():
                    job.stop()
                raise TimeoutError(f"stage {stage}: trials {sorted(running)} not finished within {timeout_s:g} s")
            time.sleep(POLL_S)
    return out
