"""``malleable simulate``: a jobs file or trace through the shared loop, or a seed paper's experiment."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from allocator.admission import OverflowMode
from allocator.fairness.policy import fair
from allocator.fairness.report import FairnessReport, loop_isolate, report_run
from allocator.fairness.teams import TeamTable
from allocator.loop import LoopResult, LoopSettings
from allocator.metrics import RunMetrics, schedule_csv, summarise
from allocator.policies import UnknownPolicyError, make_policy, policy_parameters
from allocator.profiles.io import load_profile_dir
from allocator.simulator import Physics, RescaleCost, physics_of, simulate
from allocator.simulator.run import check_physics
from allocator.simulator.experiments import EXPERIMENTS, SEED000_INTERVAL_S, Outcome, run_setting
from allocator.types import JobSpec
from allocator.workloads.seed000 import load_category_profiles
from allocator.workloads.trace import TraceError, read_trace
from flows.idle_replay import replay_idle_nodes
from flows.commands.shared.console import EXIT_FAILED, console, fail
from flows.commands.shared.fairness_tables import teams_table
from flows.config.jobfile import load_jobs_file, load_noise_file, with_noise
from flows.config.teams_file import load_teams_file
from flows.config.paths import check_output_dir, read_text_file

# matplotlib (flows.recording.plots) is imported where a plot is drawn: `--no-plots` and bad input never
# pay for it.

DEFAULT_PROFILES = Path(__file__).resolve().parents[2] / "examples" / "profiles"
# One default for the CLI and the loop (re-allocate on every arrival and completion too; the
# loop's queue discipline): the CLI reads them from LoopSettings rather than restating them.
DEFAULT_LOOP = LoopSettings()
DEFAULT_REACT = DEFAULT_LOOP.react_to_events
DEFAULT_COST = RescaleCost()


class RescaleMode(str, Enum):
    IN_PLACE = "in-place"
    RESTART = "restart"


def load_workload(path: Path, profiles_dir: Path, envelope: bool = False) -> tuple[list[JobSpec], int | None]:
    """A jobs file (YAML, or JSON mapping) or a trace (CSV, or JSON list) -> jobs, default GPUs.

    A trace's jobs take their profiles from ``profiles_dir``: every ``*.json`` there, named by
    file stem (``category`` N selects ``cat<N>``, seed 000's files)."""
    if path.suffix in (".csv", ".json"):
        text = read_text_file(path, "trace" if path.suffix == ".csv" else "workload file")
        if path.suffix == ".csv" or text.lstrip().startswith("["):
            profiles = load_profile_dir(profiles_dir, envelope)
            jobs = read_trace(text, "csv" if path.suffix == ".csv" else "json", profiles, source=str(path))
            # Said only once the trace is good: a rejected one prints its one error line alone.
            console.print(f"profiles from {profiles_dir}: {', '.join(sorted(profiles))}" + (" (monotone envelope)" if envelope else ""))
            return jobs, None
    spec = load_jobs_file(path)
    return list(spec.jobs), spec.gpus


def _param_value(text: str) -> object:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def policy_settings(names: list[str], params: list[str], strict_fifo: bool | None) -> dict[str, dict[str, object]]:
    """``--param [POLICY:]KEY=VALUE`` per policy (unscoped: every policy given); ``--strict-fifo``/
    ``--backfill`` also reaches a policy with its own ``strict_fifo``. ValueError names the flag."""
    out: dict[str, dict[str, object]] = {name: {} for name in names}
    for raw in params:
        target, eq, value = raw.partition("=")
        scope, _, key = target.rpartition(":")
        if not eq or not key:
            raise ValueError(f"param={raw!r}: expected [POLICY:]KEY=VALUE")
        if scope and scope not in out:
            raise ValueError(f"param={raw!r}: policy {scope!r} is not among --policy {', '.join(names)}")
        if key == "noise":
            raise ValueError(
                f"param={raw!r}: noise scales belong to the jobs, where the physics and every policy read them: "
                "give each job (or its profile) a noise_scale field (docs/jobs-file.md), or pass --noise FILE.json"
            )
        for name in [scope] if scope else names:
            known = tuple(k for k in policy_parameters(name) if k != "noise")
            if key not in known:
                raise ValueError(f"param={raw!r}: policy {name} takes {', '.join(known) or 'no parameters'}")
            out[name][key] = _param_value(value)
    if strict_fifo is not None:
        for name in names:
            if "strict_fifo" in policy_parameters(name):
                out[name].setdefault("strict_fifo", strict_fifo)
    return out


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


def _run_trace(
    jobs: list[JobSpec], policies: dict[str, dict[str, object]], capacity: int, settings: LoopSettings, cost: RescaleCost, out: Path, plots: bool,
    teams: TeamTable | None = None, fairness: bool = True,
) -> None:
    specs = {j.id: j for j in jobs}
    physics = physics_of(jobs)
    table = Table(title=f"{len(jobs)} jobs on {capacity} GPUs, Δ = {settings.interval_s:g} s, {settings.overflow.value}, {physics.value} physics")
    table.add_column("policy")
    for col in METRIC_COLUMNS:
        table.add_column(col, justify="right")
    runs: list[tuple[str, LoopResult]] = []
    reports: list[tuple[str, FairnessReport]] = []
    summary = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=len(policies))
        for name in policies:
            bar.update(task, description=f"simulating {name}")
            chosen = make_policy(name, **policies[name])
            result = simulate(jobs, fair(chosen, teams, settings.strict_fifo) if teams is not None and fairness else chosen, capacity, settings, cost)
            metrics = summarise(result, specs)
            runs.append((name, result))
            summary[name] = {"physics": physics.value} | metrics_dict(metrics) | ({"params": policies[name]} if policies[name] else {})
            table.add_row(result.policy, *metrics_row(metrics))
            if teams is not None:
                # Each team's jobs alone on its share, under the same policy and loop: ρ's denominator.
                isolate = loop_isolate(lambda team_jobs, gpus, name=name: simulate(team_jobs, make_policy(name, **policies[name]), gpus, settings, cost))
                reports.append((result.policy, report_run(result, jobs, teams, isolate)))
                summary[name]["fairness"] = {"fair": fairness, **reports[-1][1].as_dict()}
            (out / f"schedule-{name}.csv").write_text(schedule_csv(result))
            bar.advance(task)
    if plots:
        from flows.recording.plots import plot_completed, plot_gpus_per_job

        for name, result in runs:
            plot_gpus_per_job(result, f"GPUs per job — {name}", out / f"gpus-per-job-{name}.png")
        plot_completed(runs, [j.arrival_time for j in jobs], f"{len(jobs)} jobs on {capacity} GPUs", out / "jobs-completed.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(table)
    for label, report in reports:
        console.print(teams_table(report, f"teams under {label}: ρ against each team alone on its share"))
    console.print(physics_line(jobs, physics), highlight=False)
    console.print(f"schedules{', plots' if plots else ''} and summary.json written to [bold]{out}[/]")


def physics_line(jobs: list[JobSpec], physics: Physics) -> str:
    if physics is Physics.THROUGHPUT:
        return "physics: throughput (no job carries a noise_scale): a job progresses by samples at T(B, k), every batch's samples counted the same"
    noisy = sum(j.noise_scale is not None for j in jobs)
    return (
        f"physics: goodput ({noisy} of {len(jobs)} jobs carry a noise_scale): every policy's jobs progress by base-batch-equivalent samples "
        "at T(B, k) x E(B), E = (B_noise + B0) / (B_noise + B); JCTs are goodput JCTs"
    )


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def _run_experiment(name: str, seeds: tuple[int, ...], interval_s: float, cost: RescaleCost, profiles_dir: Path, out: Path, plots: bool) -> None:
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


def simulate_command(
    workload: Annotated[Path | None, typer.Argument(help="Jobs file (YAML/JSON) or trace (CSV/JSON list).")] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", "-e", help=f"Named experiment: {', '.join(EXPERIMENTS)}.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", help="Cluster size (default: the jobs file's).")] = None,
    policy: Annotated[list[str] | None, typer.Option("--policy", "-p", help="Policy; repeat to compare (default elastic_dp).")] = None,
    interval: Annotated[float, typer.Option("--interval", help="Δ: seconds between re-allocations.")] = SEED000_INTERVAL_S,
    react: Annotated[bool, typer.Option("--react/--no-react", help="Also re-allocate on every arrival/completion (the loop's default).")] = DEFAULT_REACT,
    overflow: Annotated[OverflowMode, typer.Option("--overflow", help="What happens to jobs that do not fit.")] = OverflowMode.QUEUE,
    strict_fifo: Annotated[
        bool | None,
        typer.Option("--strict-fifo/--backfill", help="Queue discipline: the first job that does not fit blocks the rest, or later jobs that fit pass it. Default: each policy's own (fixed_batch backfills; the loop admits strictly)."),
    ] = None,
    param: Annotated[list[str] | None, typer.Option("--param", help="Policy parameter [POLICY:]KEY=VALUE, repeatable (e.g. fixed_batch_dp:batch_choice=random).")] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per experiment setting (0..N-1).")] = 3,
    in_place_cost: Annotated[float, typer.Option("--in-place-cost", help="Seconds lost per in-place rescale.")] = DEFAULT_COST.in_place_s,
    restart_cost: Annotated[float, typer.Option("--restart-cost", help="Seconds lost per checkpoint-restart rescale.")] = DEFAULT_COST.restart_s,
    rescale: Annotated[RescaleMode, typer.Option("--rescale", help="How a running job changes GPUs: in-place (costs --in-place-cost) or restart (--restart-cost).")] = RescaleMode.IN_PLACE,
    start_cost: Annotated[float, typer.Option("--start-cost", help="Seconds a job loses once when it starts (launch, rendezvous).")] = DEFAULT_COST.start_s,
    batch_cost: Annotated[float, typer.Option("--batch-cost", help="Seconds a batch-only change (same GPUs, new batch or accumulation) costs: applied at a step boundary, no regroup.")] = DEFAULT_COST.batch_s,
    noise: Annotated[Path | None, typer.Option("--noise", help="JSON mapping job id or workload -> noise_scale (any jobs-file form), for jobs that give none.")] = None,
    profiles: Annotated[Path, typer.Option("--profiles", help="Directory of profile JSON files: yours (a trace's profile/model column names the file stem) or seed000_cat*.json (category N).")] = DEFAULT_PROFILES,
    monotone_envelope: Annotated[bool, typer.Option("--monotone-envelope", help="Raise measured iteration times that dip below a smaller batch's to that time (noise) instead of refusing the profile.")] = False,
    teams: Annotated[Path | None, typer.Option("--teams", help="Teams file (quotas or weights, members): fair shares among teams, and how fair each run was (docs/policies.md).")] = None,
    fairness: Annotated[bool, typer.Option("--fair/--no-fair", help="With --teams: each policy inside the teams' shares, or the policy alone with the teams only measured.")] = True,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Draw the PNG plots.")] = True,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for CSVs, plots and summaries.")] = Path("out/simulate"),
) -> None:
    """Simulate a cluster with the same autoscaling loop a real run uses.

    Idle-node policies (``idle_nodes_*``, seed 003) replay a trace of nodes that come and go
    instead: ``simulate [TRACE.csv] -p idle_nodes_milp`` runs ``malleable idle-nodes`` on it.
    """
    idle = [name for name in policy or [] if name.startswith("idle_nodes")]
    if idle and len(idle) == len(policy or []) and experiment is None:
        replay_idle_nodes(trace=workload, policy=policy, as_json=False)
        return
    if idle:
        others = [name for name in policy or [] if name not in idle]
        fail(f"--policy={idle[0]!r}: idle-node policies replay a node trace and cannot run with {', '.join(others) or '--experiment'}; run them alone")
    if (workload is None) == (experiment is None):
        fail("give either a WORKLOAD file or --experiment NAME")
    if not (math.isfinite(interval) and interval > 0):
        fail(f"--interval={interval}: must be a finite number > 0")
    if seeds < 1:
        fail(f"seeds={seeds}: must be >= 1")
    try:
        for flag, seconds in (("in_place_cost", in_place_cost), ("restart_cost", restart_cost), ("start_cost", start_cost), ("batch_cost", batch_cost)):
            if not (math.isfinite(seconds) and seconds >= 0):
                fail(f"{flag}={seconds}: must be a finite number of seconds >= 0")
        cost = RescaleCost(in_place_s=in_place_cost, restart_s=restart_cost, start_s=start_cost, in_place=rescale is RescaleMode.IN_PLACE, batch_s=batch_cost)
        if experiment is not None:
            if noise is not None:
                fail(f"--noise={str(noise)!r}: gives noise scales to a WORKLOAD file's jobs; --experiment generates its own")
            if teams is not None:
                fail(f"--teams={str(teams)!r}: shares a WORKLOAD file's jobs among teams; --experiment's jobs belong to none")
            if experiment not in EXPERIMENTS:
                fail(f"experiment={experiment!r}: unknown; choose one of {', '.join(EXPERIMENTS)}")
            load_category_profiles(profiles)  # a bad --profiles fails here, before anything is written
            check_output_dir(out, "--out")
            out.mkdir(parents=True, exist_ok=True)  # only once the input is known good
            _run_experiment(experiment, tuple(range(seeds)), interval, cost, profiles, out, plots)
            return
        assert workload is not None
        jobs, file_gpus = load_workload(workload, profiles, monotone_envelope)
        table = None if teams is None else load_teams_file(teams)
        if noise is not None:
            jobs = with_noise(jobs, load_noise_file(noise))
        capacity = gpus if gpus is not None else file_gpus
        if capacity is None or capacity <= 0:
            fail(f"gpus={capacity}: give a positive --gpus (or 'gpus' in the jobs file)")
        names = policy or ["elastic_dp"]
        settings = policy_settings(names, param or [], strict_fifo)
        for name in names:  # a policy that weighs rescale costs plans with this run's
            if "rescale_cost_s" in policy_parameters(name):
                settings[name].setdefault("rescale_cost_s", cost.in_place_s if cost.in_place else cost.restart_s)
        for name in names:
            check_physics(make_policy(name, **settings[name]), jobs, None)  # fail fast on a bad name or value, before any work
        loop = LoopSettings(interval_s=interval, overflow=overflow, react_to_events=react, strict_fifo=DEFAULT_LOOP.strict_fifo if strict_fifo is None else strict_fifo)
        check_output_dir(out, "--out")
        out.mkdir(parents=True, exist_ok=True)
        _run_trace(jobs, settings, capacity, loop, cost, out, plots, table, fairness)
    except (UnknownPolicyError, TraceError) as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc))
    except OSError as exc:  # the checks passed but writing failed: a full disk, a vanished directory
        fail(f"--out={str(out)!r}: cannot write {exc.filename or ''} ({exc.strerror or exc})", code=EXIT_FAILED)
