"""``malleable hpo plan|run``: RubberBand plans for successive-halving HPO (seed 001)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from allocator.hpo.model import Prediction
from allocator.hpo.planner import NoFeasiblePlanError, PlanResult, Scorer, exhaustive_plan, greedy_plan, static_baseline
from allocator.hpo.spec import HpoSpec
from flows.commands.shared.common import prefect_state_or_fail, scheduler_or_fail, settings_or_fail
from flows.commands.shared.console import EXIT_FAILED, console, fail
from flows.config.hpo_file import load_hpo_file

app = typer.Typer(help="Deadline-constrained, cost-minimising plans for successive-halving HPO (seed 001).", no_args_is_help=True)


class Planner(str, Enum):
    GREEDY = "greedy"
    EXHAUSTIVE = "exhaustive"


class OutputFormat(str, Enum):
    TABLE = "table"
    JSON = "json"


@dataclasses.dataclass(frozen=True, slots=True)
class HpoPlanReport:
    """The chosen plan beside the static baseline, and how long planning took."""

    spec: HpoSpec
    plan: PlanResult
    static: PlanResult | None
    plan_time_s: float

    @property
    def cost_ratio_vs_static(self) -> float | None:
        return None if self.static is None else self.plan.prediction.cost / self.static.prediction.cost


def make_report(spec: HpoSpec, planner: Planner = Planner.GREEDY, samples: int = 0, seed: int = 0) -> HpoPlanReport:
    """Plan ``spec`` and its static baseline; raises NoFeasiblePlanError when nothing meets the deadline."""
    started = time.perf_counter()
    chosen = greedy_plan(spec, samples=samples, seed=seed) if planner is Planner.GREEDY else exhaustive_plan(spec, samples=samples, seed=seed)
    elapsed = time.perf_counter() - started
    try:
        static = static_baseline(spec, Scorer(spec, samples, seed))
    except NoFeasiblePlanError:
        static = None
    return HpoPlanReport(spec, chosen, static, elapsed)


def prediction_dict(p: Prediction, spec: HpoSpec) -> dict[str, object]:
    return {
        "plan_gpus": list(p.plan),
        "jct_s": round(p.jct_s, 3),
        "cost": round(p.cost, 4),
        "compute_cost": round(p.compute_cost, 4),
        "data_cost": round(p.data_cost, 4),
        "meets_deadline": p.meets(spec.deadline_s),
        "samples": p.samples,
        "jct_std_s": round(p.jct_std_s, 3),
        "cost_std": round(p.cost_std, 4),
        "stages": [
            {
                "stage": i,
                "trials": st.trials,
                "iters": st.iters,
                "gpus": sp.layout.gpus,
                "gpus_per_trial": sp.layout.gpus_per_trial,
                "parallel_trials": sp.layout.parallel,
                "waves": sp.layout.waves,
                "instances": sp.layout.instances,
                "split_trials": sp.layout.split_trials,
                "start_s": round(sp.start_s, 3),
                "end_s": round(sp.end_s, 3),
            }
            for i, (st, sp) in enumerate(zip(spec.stages, p.stages))
        ],
    }


def report_dict(report: HpoPlanReport) -> dict[str, object]:
    ratio = report.cost_ratio_vs_static
    return {
        "name": report.spec.name,
        "deadline_s": report.spec.deadline_s,
        "planner": report.plan.method,
        "plan": prediction_dict(report.plan.prediction, report.spec),
        "static": None if report.static is None else prediction_dict(report.static.prediction, report.spec),
        "cost_ratio_vs_static": None if ratio is None else round(ratio, 4),
        "plan_time_s": round(report.plan_time_s, 4),
        "evaluations": report.plan.evaluations,
    }


def _money(dollars: float) -> str:
    return f"{dollars:.2f}" if dollars >= 1 or dollars == 0 else f"{dollars:.4f}"


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def plan_table(report: HpoPlanReport) -> Table:
    spec, chosen = report.spec, report.plan.prediction
    static = report.static.prediction if report.static else None
    table = Table(title=f"{spec.name}: {report.plan.method} plan, deadline {_mmss(spec.deadline_s)} ({spec.cloud.instance.name}, {spec.cloud.instance.gpus} GPUs each)")
    for col in ("stage", "trials", "steps", "GPUs", "per trial", "at once", "inst", "split", "start", "end", "static"):
        table.add_column(col, justify="right")
    for i, (st, sp) in enumerate(zip(spec.stages, chosen.stages)):
        lay = sp.layout
        table.add_row(
            str(i),
            str(st.trials),
            str(st.iters),
            str(lay.gpus),
            str(lay.gpus_per_trial),
            f"{lay.parallel}" + (f" x{lay.waves}" if lay.waves > 1 else ""),
            str(lay.instances),
            str(lay.split_trials),
            _mmss(sp.start_s),
            _mmss(sp.end_s),
            "-" if static is None else str(static.stages[i].layout.gpus),
        )
    return table


def _summary(report: HpoPlanReport) -> Table:
    table = Table(title="predicted JCT and cost")
    for col in ("plan", "JCT", "cost $", "compute $", "data $", "meets deadline"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    rows = [(report.plan.method, report.plan.prediction)]
    if report.static is not None:
        rows.append(("static", report.static.prediction))
    for name, p in rows:
        jct = _mmss(p.jct_s) + (f" ± {p.jct_std_s:.1f}s" if p.samples else "")
        table.add_row(name, jct, _money(p.cost), _money(p.compute_cost), _money(p.data_cost), "yes" if p.meets(report.spec.deadline_s) else "NO")
    return table


def plan(
    hpo_file: Annotated[Path, typer.Argument(help="HPO job file, YAML or JSON (docs/hpo.md).")],
    deadline: Annotated[float | None, typer.Option("--deadline", "-d", help="Deadline in seconds (default: the file's deadline_s).")] = None,
    planner: Annotated[Planner, typer.Option("--planner", help="greedy (RubberBand) or exhaustive (small jobs).")] = Planner.GREEDY,
    samples: Annotated[int, typer.Option("--samples", help="Monte-Carlo samples per plan (0: deterministic).")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the Monte-Carlo draws.")] = 0,
    output: Annotated[OutputFormat, typer.Option("--format", "-f", help="table or json.")] = OutputFormat.TABLE,
) -> None:
    """Plan GPUs per stage to meet the deadline at least cost; compare with the best static cluster."""
    if samples < 0:
        fail(f"--samples={samples}: must be >= 0")
    try:
        spec = load_hpo_file(hpo_file)
        if deadline is not None:
            spec = dataclasses.replace(spec, deadline_s=deadline)
        report = make_report(spec, planner, samples, seed)
    except NoFeasiblePlanError as exc:
        fail(f"infeasible: {exc}", code=1)
    except ValueError as exc:
        fail(str(exc))
    if output is OutputFormat.JSON:
        typer.echo(json.dumps(report_dict(report), indent=2))
        return
    console.print(plan_table(report))
    console.print(_summary(report))
    ratio = report.cost_ratio_vs_static
    tail = "no static cluster meets the deadline" if ratio is None else f"cost vs static: {ratio:.2f}x"
    console.print(f"{tail}; planned in {report.plan_time_s:.3f} s ({report.plan.evaluations} plans scored)")


app.command("plan")(plan)


def run(
    hpo_file: Annotated[Path, typer.Argument(help="HPO job file with an 'entrypoint' (docs/hpo.md).")],
    workers: Annotated[int | None, typer.Option("--workers", "-w", help="(Virtual) GPU workers (default: MALLEABLE_WORKERS).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a stage may take before the run fails.")] = 1800.0,
) -> None:
    """Run the plan for real: each stage's trials are jobs of the scheduler service (the running one when MALLEABLE_JOB_STORE names it, else one for this run), resized per stage, losers stopped."""
    try:
        spec = load_hpo_file(hpo_file)
        if spec.entrypoint is None:
            fail(f"{hpo_file}: entrypoint: missing; running a plan needs 'package.module:function'")
        if workers is not None and workers < 1:
            fail(f"--workers={workers}: must be a positive integer")
        if not (math.isfinite(timeout) and timeout > 0):
            fail(f"--timeout={timeout}: must be a finite number of seconds > 0")
        # Before any cluster starts: a broken entry point is one line now, not a failed stage later.
        from elastic_tasks.recipe import load_entry_point

        load_entry_point(spec.entrypoint)
    except ValueError as exc:  # EntryPointError is one
        fail(str(exc))
    scheduler_or_fail(settings_or_fail(workers=workers))
    prefect_state_or_fail()
    # Imported here: prefect, dask and torch are not needed to plan.
    from flows.hpo_flow import hpo_flow
    from flows.config.settings import SettingsError

    try:
        result = hpo_flow(str(hpo_file), workers=workers, timeout_s=timeout)
    except NoFeasiblePlanError as exc:
        fail(f"infeasible on these workers: {exc}", code=1)
    except (SettingsError, ValueError) as exc:
        fail(str(exc))
    except TimeoutError as exc:
        fail(f"hpo run timed out: {exc}", code=EXIT_FAILED)
    except Exception as exc:  # a trial failed; its runs are already ended FAILED in MLflow
        fail(f"hpo run failed: {type(exc).__name__}: {exc}", code=EXIT_FAILED)
    table = Table(title=f"{spec.name}: measured")
    for col in ("stage", "trials", "GPUs", "per trial", "kept", "predicted s", "actual s"):
        table.add_column(col, justify="right")
    for rec in result.stages:
        table.add_row(
            str(rec.stage),
            str(len(rec.trials)),
            str(rec.layout.gpus),
            str(rec.layout.gpus_per_trial),
            " ".join(map(str, rec.kept)),
            f"{rec.predicted_end_s - rec.predicted_start_s:.1f}",
            f"{rec.end_s - rec.start_s:.1f}",
        )
    console.print(table)
    p = result.prediction
    console.print(
        f"JCT predicted {p.jct_s:.1f} s, actual {result.actual_jct_s:.1f} s; cost predicted ${p.cost:.4f}, actual ${result.actual_cost:.4f}; "
        f"best trial {result.best_trial}; MLflow run {result.run}"
    )


app.command("run")(run)
