"""Issue 26's growth scenario: a job that ran fast on 2 GPUs must not be grown back to a slower configuration.

A scheduler service (the one ``malleable serve`` runs, embedded here) on 2 local Dask
workers; job A (``resnet_small`` by default) with no offline profile — the neutral prior a
``malleable submit`` without ``--profile`` gets — runs alone on both workers; job B arrives
``--b-arrival`` seconds later, A shrinks to one worker and B takes the other; when B finishes A
grows back. Each generation's predicted and measured samples/s come from the store (what
``malleable jobs --generations`` shows; measured: the global batch over the generation's median
step time, ``allocator/profiles/steady_rate.py``).

``growth_throughput_ratio``: the samples/s A measured in its last generation on 2 GPUs (after
the growth) over the best it measured on 2 GPUs before B arrived. With ``--no-trust`` the loop
applies the policy's answer as is (the behaviour before issue 26), for the side-by-side figure.

    .venv/bin/python benchmarks/growth_bench.py [--samples-a 120000 --samples-b 15000 --b-after-samples 20000] [--no-trust]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Generation:
    time: float
    gpus: int
    batch: int
    kind: str
    predicted: float | None
    measured: float | None


@dataclass(frozen=True, slots=True)
class GrowthRun:
    a: tuple[Generation, ...]
    b: tuple[Generation, ...]
    b_finished_at: float
    wall_split_a: dict | None
    mlflow_a: dict[str, list[float]]  # metric -> values of A's MLflow run (predicted/measured samples/s)


def run_growth(
    workdir: Path, model: str = "resnet_small", samples_a: int = 60_000, samples_b: int = 30_000, b_arrival_s: float = 10.0,
    interval_s: float = 5.0, trust: bool = True, max_batch: int = 256, b_after_samples: int | None = None,
) -> GrowthRun:  # fmt: skip
    """One run of the scenario in ``workdir``; each job's generations as the store recorded them.

    B arrives ``b_arrival_s`` after A started, or — with ``b_after_samples`` — once A has done
    that many samples: then the scenario is the same on a fast machine and a loaded one (A has
    measured its 2-GPU generation before B, and has work left to grow back into after it)."""
    from allocator.types import JobSpec
    from deploy.clusters import connect
    from service.embedded import EmbeddedService
    from service.jobs.priors import prior_profile
    from service.runner import ServiceConfig

    entry = f"elastic_tasks.examples:{model}"
    prior = prior_profile(entry)
    specs = [
        JobSpec(id="job-a", workload=entry, total_samples=samples_a, min_batch=32, max_batch=max_batch, max_gpus=2, profile=prior),
        JobSpec(id="job-b", workload=entry, total_samples=samples_b, min_batch=32, max_batch=max_batch, max_gpus=2, profile=prior),
    ]
    config = ServiceConfig(
        store_url=f"sqlite:///{workdir / 'jobs.db'}", checkpoint_root=str(workdir / "checkpoints"), interval_s=interval_s,
        tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}", experiment="growth", trust_measurements=trust,
    )  # fmt: skip
    with connect("local", workers=2) as client:
        from elastic_tasks.cluster import warm_up

        warm_up(client, entry)
        with EmbeddedService(config, client) as service:
            # B's arrival counts from A's start: the service may take a while to begin its loop.
            key = f"growth-{time.time_ns()}"
            ids = service.submit_at_arrivals(specs[:1], key_prefix=key)
            deadline = time.monotonic() + 600
            while service.service.store.job(ids["job-a"]).state.value != "running" and time.monotonic() < deadline:
                time.sleep(0.2)
            if b_after_samples is not None:
                while service.service.store.job(ids["job-a"]).samples_done < b_after_samples and time.monotonic() < deadline:
                    time.sleep(0.2)
            arrival = 0.0 if b_after_samples is not None else b_arrival_s
            ids |= service.submit_at_arrivals([replace(specs[1], arrival_time=arrival)], key_prefix=key)
            service.wait(list(ids.values()), timeout_s=1800)
            store = service.service.store
            rows = {r.name: r for r in store.jobs(ids=list(ids.values()))}
            gens = {name: tuple(Generation(a.time, a.gpus, a.batch, a.kind, a.predicted_samples_per_s, a.measured_samples_per_s) for a in store.allocations(r.id) if a.gpus > 0) for name, r in rows.items()}
            run_id = rows["job-a"].mlflow_run_id
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    metrics = {m: [h.value for h in client.get_metric_history(run_id, m)] for m in ("predicted_samples_per_s", "measured_samples_per_s")} if run_id else {}
    return GrowthRun(gens["job-a"], gens["job-b"], rows["job-b"].finished_at or 0.0, rows["job-a"].wall_split, metrics)


def growth_ratio(run: GrowthRun) -> tuple[float | None, Generation | None, Generation | None]:
    """(A's last measured samples/s on 2 GPUs after B ended / its best measured on 2 GPUs before B arrived, that last, that best)."""
    arrival = run.b[0].time if run.b else float("inf")
    before = [g for g in run.a if g.gpus == 2 and g.time < arrival and g.measured is not None]
    after = [g for g in run.a if g.gpus == 2 and g.time >= run.b_finished_at - 1.0 and g.measured is not None]
    if not before or not after:
        return None, after[-1] if after else None, None
    best = max(before, key=lambda g: g.measured)
    return after[-1].measured / best.measured, after[-1], best


def _sample_load(into: list[tuple[float, float]], done: threading.Event, every_s: float = 1.0) -> None:
    while not done.wait(every_s):
        into.append((time.time(), os.getloadavg()[0]))


def _load_range(loads: list[tuple[float, float]], start: float, end: float) -> list[float] | None:
    seen = [v for t, v in loads if start <= t < end]
    return [round(min(seen), 1), round(max(seen), 1)] if seen else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet_small")
    ap.add_argument("--samples-a", type=int, default=120_000)
    ap.add_argument("--samples-b", type=int, default=15_000)
    ap.add_argument("--b-after-samples", type=int, default=20_000, help="B arrives once A has done this many samples (its 2-GPU generation measured, whatever the machine's speed)")
    ap.add_argument("--b-arrival", type=float, default=None, help="instead: seconds after A starts")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--no-trust", action="store_true", help="the policy's answer as is (before issue 26)")
    args = ap.parse_args()
    t0 = time.monotonic()
    loads: list[tuple[float, float]] = []  # (epoch s, 1-minute load average): is a ratio the box's doing?
    done = threading.Event()
    sampler = threading.Thread(target=_sample_load, args=(loads, done), daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="growth-") as d:
        b_after = None if args.b_arrival is not None else args.b_after_samples
        run = run_growth(Path(d), args.model, args.samples_a, args.samples_b, args.b_arrival or 0.0, args.interval, trust=not args.no_trust, b_after_samples=b_after)
    done.set()
    ratio, last, best = growth_ratio(run)
    for name, gens in (("job-a", run.a), ("job-b", run.b)):
        for g in gens:
            print(f"{name} {g.kind:9} {g.gpus} x {g.batch:4}  predicted {g.predicted or float('nan'):8.0f}  measured {g.measured or float('nan'):8.0f} samples/s")
    print(
        json.dumps(
            {
                "model": args.model, "samples": [args.samples_a, args.samples_b], "trust": not args.no_trust,
                "generations_a": [[g.gpus, g.batch, g.kind, g.predicted and round(g.predicted, 1), g.measured and round(g.measured, 1)] for g in run.a],
                "best_before_growth": best and [best.gpus, best.batch, round(best.measured, 1)],
                "last_after_growth": last and [last.gpus, last.batch, round(last.measured, 1)],
                "wall_split_a": run.wall_split_a,
                # The same configuration before and after: the ratio then measures the machine's load, not a decision.
                "same_configuration_as_best": None if last is None or best is None else (last.gpus, last.batch) == (best.gpus, best.batch),
                "wall_s": round(time.monotonic() - t0, 1),
                # Per generation of A, the box's 1-minute load average [min, max] while it ran: on a
                # shared machine a ratio far from 1 with unequal loads measures the box, not the job.
                "load_1m_a": [_load_range(loads, g.time, nxt.time if nxt else float("inf")) for g, nxt in zip(run.a, (*run.a[1:], None))],
                "growth_throughput_ratio": None if ratio is None else round(ratio, 3),
            }
        )  # fmt: skip
    )


if __name__ == "__main__":
    main()
