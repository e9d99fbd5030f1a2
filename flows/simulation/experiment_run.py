"""``simulate --experiment NAME``: a seed paper's experiment over several seeds, summarised."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from allocator.metrics import schedule_csv
from allocator.simulator import RescaleCost
from allocator.simulator.experiments import EXPERIMENTS, Outcome, run_setting
from allocator.workloads.seed000 import load_category_profiles
from flows.commands.shared.console import console
from flows.simulation.trace_run import metrics_dict


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def run_experiment(name: str, seeds: tuple[int, ...], interval_s: float, cost: RescaleCost, profiles_dir: Path, out: Path, plots: bool) -> None:
    profiles = load_category_profiles(profiles_dir)
    settings = EXPERIMENTS[name]
    total = sum(len(s.policies) for s in settings) * len(seeds)
    outcomes: list[Outcome] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=total)

        def advance(o: Outcome) -> None:
            bar.update(task, description=f"{o.setting.name} · {o.policy.label} · seed {o.seed}")
            bar.advance(task)

        for setting in settings:
            outcomes += run_setting(setting, profiles, seeds, interval_s, cost, on_run=advance)

    grouped: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        grouped[(o.setting.name, o.policy.label)].append(o)
    table = Table(title=f"{name}: mean ± sd over seeds {list(seeds)}, Δ = {interval_s:g} s")
    for col in ("setting", "policy", "jobs", "done", "drop %", "SJS eff. %", "avg JCT min", "util %"):
        table.add_column(col, justify="left" if col in ("setting", "policy") else "right")
    lines = ["| setting | policy | jobs | completed | drop % | SJS eff. % | avg JCT (min) | GPU util % | paper |", "|---|---|---|---|---|---|---|---|---|"]
    rows_json = []
    for setting in settings:
        for choice in setting.policies:
            group = grouped[(setting.name, choice.label)]
            ms = [o.metrics for o in group]
            cells = [
                _mean_sd([m.jobs_total for m in ms]),
                _mean_sd([m.jobs_completed for m in ms]),
                _mean_sd([100 * m.drop_ratio for m in ms]),
                _mean_sd([100 * m.sjs_efficiency for m in ms]),
                _mean_sd([m.avg_jct_s / 60 for m in ms if m.avg_jct_s is not None]),
                _mean_sd([100 * m.gpu_utilisation for m in ms]),
            ]
            table.add_row(setting.name, choice.label, *cells)
            lines.append(f"| {setting.name} | {choice.label} | " + " | ".join(cells) + f" | {setting.paper if choice is setting.policies[0] else ''} |")
            rows_json += [{"setting": setting.name, "policy": choice.label, "seed": o.seed, **metrics_dict(o.metrics)} for o in group]
        first_seed = [o for o in outcomes if o.setting is setting and o.seed == seeds[0]]
        if plots:
            from flows.recording.plots import plot_completed

            plot_completed(
                [(o.policy.label, o.result) for o in first_seed],
                [j.arrival_time for j in first_seed[0].jobs],
                f"{setting.description} (seed {seeds[0]})",
                out / f"{setting.name}-completed.png",
            )
        for o in first_seed:
            slug = o.policy.label.replace(" ", "-")
            (out / f"{setting.name}-{slug}-schedule.csv").write_text(schedule_csv(o.result))
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(rows_json, indent=1) + "\n")
    console.print(table)
    console.print(f"plots, schedules, summary.md and results.json written to [bold]{out}[/]")
