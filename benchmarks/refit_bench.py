"""Online throughput refit on a real CPU run: prediction error of each generation before it runs.

One elastic job (``resnet_small``, memory cap 16 samples per rank) trains on a 2-worker Dask
LocalCluster through a sequence of generations that change GPUs, global batch and hence
gradient accumulation. No offline profile: the first generation is the probe. Before each
later generation starts, the model fitted (``allocator.profiles.refit``) on the steps of all earlier
generations predicts its median step time; then its steps are added.

Figures: ``prediction_error_pct`` per generation (|predicted / measured median - 1|), the
error of the final fit on every generation (in sample), and the fitted coefficients.
Step times are the trainer's own ``StepRecord.wall_s`` (first 3 steps of each generation
dropped: warm-up after a regroup), and, as a check on machine contention, its ``cpu_s``.
The probe's configuration runs again at the end: ``probe_repeat_drift_pct`` is how much the
same step's time moved during the run (two cores shared with other work).

Run: python benchmarks/refit_bench.py
"""

from __future__ import annotations

import json
import statistics
import time

from distributed import Client

from allocator.profiles.refit import OnlineThroughputFit, StepObservation
from deploy.local import local_gpu_cluster
from elastic_tasks.cluster import WorkerPool, warm_up
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.examples.recipes import resnet_small
from elastic_tasks.protocol import TrainConfig
from elastic_tasks.rank.scaling import accumulation_steps

ENTRY = "elastic_tasks.examples.recipes:resnet_small"
CAP = 16
STEPS_PER_GEN = 14
SKIP = 3
# (GPUs, global batch): accumulation follows from the cap
GENERATIONS = [(1, 16), (1, 32), (2, 32), (2, 64), (1, 8), (2, 16), (1, 48), (2, 48)]
REPEAT = (1, 16)  # the probe's configuration again at the end: how far the machine itself drifted
SEQUENCE = [*GENERATIONS, REPEAT]
HALF_LIFE = 60  # steps: about one generation


def _step(job: JobCoordinator) -> int:
    status = job.status()
    return status.step if status is not None else 0


def main() -> None:
    params = sum(p.numel() for p in resnet_small().build_model().parameters())
    config = TrainConfig(global_batch=GENERATIONS[0][1], max_steps=100_000, max_batch_per_gpu=CAP,
                         timeout_s=30.0, evaluate=False)
    t0 = time.perf_counter()
    with local_gpu_cluster(2) as cluster, Client(cluster) as client:
        warm_up(client, ENTRY)
        job = JobCoordinator(client, WorkerPool(client), f"refit-{time.monotonic_ns()}", ENTRY, config)
        job.start(SEQUENCE[0][0])
        for nxt in [*SEQUENCE[1:], None]:
            # Each generation trains STEPS_PER_GEN steps from the moment it applied, then the next is asked for.
            begin = _step(job)
            while _step(job) < begin + STEPS_PER_GEN:
                time.sleep(0.05)
            if nxt is None:
                job.stop()
            else:
                job.rescale(nxt[0], global_batch=nxt[1])
        result = job.wait(120)
    wall = time.perf_counter() - t0
    segments = _segments(result.history)
    print("steps kept per generation:", [len(seg) for seg in segments], flush=True)
    figures: dict[str, object] = {}
    for clock, half_life in (("wall_s", None), ("wall_s", HALF_LIFE), ("cpu_s", None)):
        errors, final = _predict_each(segments, params, clock, half_life)
        label = clock if half_life is None else f"{clock}_half_life_{half_life}"
        medians = [statistics.median(getattr(r, clock) for r in seg) for seg in segments]
        for g, ((k, batch), med) in enumerate(zip(SEQUENCE, medians)):
            note = f"error before it ran {errors[g - 1]:5.1f} %" if g else "(probe)"
            print(f"{label} gen {g}: k={k} B={batch} accum={accumulation_steps(batch, k, CAP)} median {med * 1000:6.1f} ms  {note}")
        figures[f"{label}_prediction_error_pct"] = errors
        figures[f"{clock}_median_ms"] = [round(m * 1000, 1) for m in medians]
        figures[f"{label}_mean_error_last_half_pct"] = round(statistics.mean(errors[len(errors) // 2 :]), 1)
        figures[f"{label}_fit"] = [final.alpha, final.beta, final.intra.latency_s, final.intra.seconds_per_param]
    figures["probe_repeat_drift_pct"] = round((figures["wall_s_median_ms"][-1] / figures["wall_s_median_ms"][0] - 1) * 100, 1)
    figures["num_params"] = params
    figures["run_wall_s"] = round(wall, 1)
    print(json.dumps(figures))


def _segments(history) -> list[list]:
    """Contiguous runs of one (GPUs, batch) in the order they ran, first SKIP steps of each dropped."""
    runs: list[list] = []
    previous = None
    for rec in history:
        key = (rec.world_size, rec.global_batch)
        if key != previous:
            runs.append([])
            previous = key
        runs[-1].append(rec)
    runs = [r[SKIP:] for r in runs if len(r) > SKIP]
    if [(r[0].world_size, r[0].global_batch) for r in runs] != SEQUENCE:
        raise RuntimeError(f"generations ran as {[(r[0].world_size, r[0].global_batch) for r in runs]}, expected {SEQUENCE}")
    return runs


def _predict_each(segments, params: int, clock: str, half_life: float | None):
    """Fit on generations < g, predict g's median step; then add g. Returns errors (%) and the final fit."""
    online, errors = OnlineThroughputFit(params, half_life=half_life), []
    for g, seg in enumerate(segments):
        k, batch = SEQUENCE[g]
        s = accumulation_steps(batch, k, CAP)
        obs = [StepObservation(k, -(-batch // (k * s)), s, 1, getattr(r, clock)) for r in seg]
        if g:
            measured = statistics.median(o.seconds for o in obs)
            errors.append(round(abs(online.fit().predict(obs[0], params) / measured - 1) * 100, 1))
        online.add(obs)
    return errors, online.fit()

if __name__ == "__main__":
    main()
