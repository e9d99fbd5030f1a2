"""One workload under several policy variants: a table, a schedule per variant, plots, ``summary.json``."""

from __future__ import annotations

import json
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from allocator.fairness.policy import fair
from allocator.fairness.report import FairnessReport, loop_isolate, report_run
from allocator.loop import LoopResult
from allocator.metrics import RunMetrics, schedule_csv, summarise
from allocator.policies import Policy, PolicyVariant
from allocator.simulator import Physics, physics_of, simulate
from allocator.types import JobSpec
from flows.commands.shared.console import console
from flows.commands.shared.fairness_tables import teams_table
from flows.config.teams_file import load_teams_file
from flows.simulation.choices import file_stem
from flows.simulation.provenance import SimInputs, SimSettings, fidelity, summary, text_digest


def _fmt_min(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def metrics_row(m: RunMetrics) -> list[str]:
    return [
        str(m.jobs_total),
        str(m.jobs_completed),
        f"{m.drop_ratio:.1%}",
        f"{m.sjs_efficiency:.1%}",
        _fmt_min(m.avg_jct_s),
        _fmt_min(m.p95_jct_s),
        _fmt_min(m.avg_queue_delay_s),
        f"{m.gpu_utilisation:.1%}",
        str(m.rescales),
        _fmt_min(m.makespan_s),
        str(m.batch_changes),
    ]


METRIC_COLUMNS = ["jobs", "done", "drop", "SJS eff.", "avg JCT min", "p95 JCT min", "queue min", "GPU util", "rescales", "makespan min", "batch changes"]


def metrics_dict(m: RunMetrics) -> dict[str, object]:
    return {
        "jobs": m.jobs_total,
        "completed": m.jobs_completed,
        "drop_ratio": round(m.drop_ratio, 4),
        "sjs_efficiency": round(m.sjs_efficiency, 4),
        "avg_jct_s": None if m.avg_jct_s is None else round(m.avg_jct_s, 1),
        "p95_jct_s": None if m.p95_jct_s is None else round(m.p95_jct_s, 1),
        "avg_queue_delay_s": None if m.avg_queue_delay_s is None else round(m.avg_queue_delay_s, 1),
        "gpu_utilisation": round(m.gpu_utilisation, 4),
        "rescales": m.rescales,
        "rescale_cost_s": round(m.rescale_cost_s, 1),
        "batch_changes": m.batch_changes,
        "batch_change_cost_s": round(m.batch_change_cost_s, 1),
        "makespan_s": round(m.makespan_s, 1),
    }


def physics_line(jobs: list[JobSpec], physics: Physics) -> str:
    if physics is Physics.THROUGHPUT:
        return "physics: throughput (no job carries a noise_scale): a job progresses by samples at T(B, k), every batch's samples counted the same"
    noisy = sum(j.noise_scale is not None for j in jobs)
    return (
        f"physics: goodput ({noisy} of {len(jobs)} jobs carry a noise_scale): every policy's jobs progress by base-batch-equivalent samples "
        "at T(B, k) x E(B), E = (B_noise + B0) / (B_noise + B); JCTs are goodput JCTs"
    )


def fidelity_line(settings: SimSettings) -> str:
    f = fidelity(settings)
    return (
        f"fidelity: decisions {f['decisions']} (Δ = {f['interval_s']:g} s{', and when a noise scale moves' if f['react_to_noise'] else ''}); "
        f"start {f['start_cost_s']:g} s, {f['rescale']} change {f['change_cost_s']:g} s, batch-only change {f['batch_change_cost_s']:g} s; "
        f"noise {str(f['noise']).split(' ')[0]}; {f['network']}" + ("" if settings.fair is None else f"; teams {f['teams']}")
    )


def run_variants(
    jobs: list[JobSpec],
    variants: list[PolicyVariant],
    settings: SimSettings,
    inputs: SimInputs,
    out: Path,
    plots: bool,
    trace_profiles: dict[str, Path] | None = None,
) -> dict[str, object]:
    """Simulate every variant, write its schedule (``schedule-<label>.csv``), the plots and
    ``summary.json``; print the table (one row per variant, by label). Returns the summary."""
    specs = {j.id: j for j in jobs}
    physics = physics_of(jobs)
    loop = settings.loop
    table = Table(title=f"{len(jobs)} jobs on {settings.gpus} GPUs, Δ = {loop.interval_s:g} s, {loop.overflow.value}, {physics.value} physics")
    table.add_column("policy")
    for col in METRIC_COLUMNS:
        table.add_column(col, justify="right")
    results: list[tuple[str, LoopResult]] = []
    runs: dict[str, tuple[PolicyVariant, dict[str, object], str, str]] = {}
    teams = load_teams_file(inputs.teams) if inputs.teams is not None else None
    reports: list[tuple[str, FairnessReport]] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=len(variants))
        for variant in variants:
            bar.update(task, description=f"simulating {variant.label}")
            def run(run_jobs: list[JobSpec], gpus: int, policy: Policy) -> LoopResult:
                return simulate(run_jobs, policy, gpus, loop, settings.cost, gpus_per_host=settings.gpus_per_host, report_noise=settings.report_noise)

            inner = variant.build()
            result = run(jobs, settings.gpus, fair(inner, teams, loop.strict_fifo) if teams is not None and settings.fair else inner)
            metrics = summarise(result, specs)
            schedule, name = schedule_csv(result), f"schedule-{file_stem(variant.label)}.csv"
            (out / name).write_text(schedule)
            record: dict[str, object] = {"physics": physics.value} | metrics_dict(metrics)
            if teams is not None:
                # Each team's jobs alone on its share, under the same policy and loop: ρ's denominator.
                isolate = loop_isolate(lambda team_jobs, gpus, variant=variant: run(list(team_jobs), gpus, variant.build()))
                reports.append((variant.label, report_run(result, jobs, teams, isolate)))
                record["fairness"] = {"fair": bool(settings.fair), **reports[-1][1].as_dict()}
            runs[variant.label] = (variant, record, name, schedule)
            results.append((variant.label, result))
            table.add_row(variant.label, *metrics_row(metrics))
            bar.advance(task)
    if plots:
        from flows.recording.plots import plot_completed, plot_gpus_per_job

        for label, result in results:
            plot_gpus_per_job(result, f"GPUs per job — {label}", out / f"gpus-per-job-{file_stem(label)}.png")
        plot_completed(results, [j.arrival_time for j in jobs], f"{len(jobs)} jobs on {settings.gpus} GPUs", out / "jobs-completed.png")
    data = summary(inputs, settings, physics.value, runs, trace_profiles)
    (out / "summary.json").write_text(json.dumps(data, indent=2) + "\n")
    console.print(table)
    for label, report in reports:
        console.print(teams_table(report, f"teams under {label}: ρ against each team alone on its share"))
    console.print(physics_line(jobs, physics), highlight=False)
    console.print(fidelity_line(settings), highlight=False)
    console.print(f"schedules{', plots' if plots else ''} and summary.json written to [bold]{out}[/]")
    return data


def reproduced(data: dict[str, object], recorded: dict[str, str]) -> list[str]:
    """Labels whose schedule differs from the one a summary recorded."""
    runs = data["policies"]
    assert isinstance(runs, dict)
    return [label for label, digest in recorded.items() if runs[label]["schedule_sha256"] != digest]


__all__ = ["METRIC_COLUMNS", "fidelity_line", "metrics_dict", "metrics_row", "physics_line", "reproduced", "run_variants", "text_digest"]
