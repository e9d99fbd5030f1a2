"""The ``reproduce-seed000`` flow: seed 000's simulated experiments, one task per setting.

Each setting (cluster size, arrivals, drop/queue) runs its policies over the seeds in the
simulator; the flow records a parent MLflow run with one nested run per (setting, policy)
holding the mean metrics, and a Prefect table beside the paper's figures.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_table_artifact

from allocator.simulator import RescaleCost
from allocator.simulator.experiments import EXPERIMENTS, SEED000_INTERVAL_S, Outcome, Setting, run_setting
from allocator.workloads.seed000 import load_category_profiles
from flows.recording.artifacts import artifact_key
from flows.recording.record import summary_metrics
from flows.config.settings import load_settings
from flows.recording.tracking import MetricPoint, tracker_from_settings

PROFILES = Path(__file__).resolve().parents[1] / "examples" / "profiles"


@task(name="simulate-setting")
def simulate_setting(setting: Setting, seeds: tuple[int, ...], interval_s: float) -> list[Outcome]:
    return run_setting(setting, load_category_profiles(PROFILES), seeds, interval_s, RescaleCost())


@flow(name="reproduce-seed000", log_prints=True)
def reproduce_seed000(experiment: str = "seed000-small", seeds: int = 3, interval_s: float = SEED000_INTERVAL_S) -> list[dict[str, object]]:
    """Run a seed-000 experiment set ('seed000' or 'seed000-small') and record it."""
    if experiment not in EXPERIMENTS:
        raise ValueError(f"experiment={experiment!r}: unknown; choose one of {', '.join(EXPERIMENTS)}")
    if seeds < 1:
        raise ValueError(f"seeds={seeds}: must be >= 1")
    tracker = tracker_from_settings(load_settings())
    parent = tracker.start_run(f"reproduce-{experiment}", params={"experiment": experiment, "seeds": seeds, "interval_s": interval_s}, tags={"malleable.mode": "reproduction"})
    rows: list[dict[str, object]] = []
    for setting in EXPERIMENTS[experiment]:
        outcomes = simulate_setting(setting, tuple(range(seeds)), interval_s)
        for choice in setting.policies:
            group = [o.metrics for o in outcomes if o.policy == choice]
            means = {k: statistics.mean(summary_metrics(m).get(k, 0.0) for m in group) for k in summary_metrics(group[0])}
            run = tracker.start_run(f"{setting.name} · {choice.label}", parent=parent, params={"setting": setting.name, "policy": choice.name, "label": choice.label, "capacity": setting.capacity})
            tracker.log_metrics(run, [MetricPoint(k, v) for k, v in means.items()])
            tracker.end_run(run)
            rows.append({"setting": setting.name, "policy": choice.label, **{k: round(v, 3) for k, v in means.items()}, "paper": setting.paper if choice is setting.policies[0] else ""})
    tracker.end_run(parent)
    create_table_artifact(key=artifact_key("reproduce", experiment), table=rows, description=f"{experiment}: means over {seeds} seeds, beside the paper")
    return rows
