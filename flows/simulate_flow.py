"""The ``simulate`` flow: a jobs file through the shared loop with the simulator, recorded.

Same loop, policy and admission as the ``cluster`` flow; only the clock and executor differ,
so the two can be compared job by job (``benchmarks/sim_vs_real_bench.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, task

from allocator.admission import OverflowMode
from allocator.loop import LoopResult, LoopSettings
from allocator.fairness.policy import fair
from allocator.fairness.report import loop_isolate, report_run
from allocator.fairness.teams import TeamTable
from allocator.policies import parse_policy
from allocator.simulator import RescaleCost, physics_of, simulate
from allocator.specs import JobsFile
from allocator.types import JobSpec
from flows.recording.artifacts import publish_results, summary_markdown
from flows.config.jobfile import load_jobs_file
from flows.config.teams_file import load_teams_file
from flows.recording.fairness_metrics import fairness_metrics
from flows.recording.record import JobOutcome, RecordedRun, record_run
from flows.config.settings import load_settings
from flows.prefect_runs import in_flow_run, step
from flows.recording.tracking import tracker_from_settings


@dataclass(frozen=True, slots=True)
class SimulateOutcome:
    result: LoopResult
    recorded: RecordedRun | None

    @property
    def outcomes(self) -> tuple[JobOutcome, ...]:
        assert self.recorded is not None
        return self.recorded.outcomes


@task(name="load-jobs")
def load_jobs(jobs_file: str) -> tuple[tuple[JobSpec, ...], int | None, str | None]:
    spec = load_jobs_file(Path(jobs_file))
    return spec.jobs, spec.gpus, spec.policy


@task(name="simulate-loop")
def simulate_loop(
    jobs: Sequence[JobSpec], policy: str, capacity: int, settings: LoopSettings, in_place_cost_s: float, start_cost_s: float = 0.0, checkpoint: tuple[float, int] = (0.0, 0),
    teams: TeamTable | None = None,
) -> tuple[LoopResult, dict[str, float]]:
    """The run, and its fairness as metrics when ``teams`` share the cluster (the policy inside their shares).

    ``policy`` is a name or a variant (NAME:KEY=VALUE,...); a policy that weighs the pause a change
    costs reads this run's from the loop (RunningJob.change_cost_s), as by every other route."""
    cost = RescaleCost(in_place_s=in_place_cost_s, start_s=start_cost_s, checkpoint_s=checkpoint[0], checkpoint_every=checkpoint[1])
    inner = parse_policy(policy).build()
    if teams is None:
        return simulate(jobs, inner, capacity, settings, cost), {}
    result = simulate(jobs, fair(inner, teams, settings.strict_fifo), capacity, settings, cost)
    isolate = loop_isolate(lambda team_jobs, gpus: simulate(team_jobs, parse_policy(policy).build(), gpus, settings, cost))
    return result, fairness_metrics(report_run(result, jobs, teams, isolate))


@task(name="record-mlflow", retries=2, retry_delay_seconds=2)
def record_simulation(name: str, result: LoopResult, jobs: Sequence[JobSpec], start_ms: int, params: dict, extra: dict[str, float] | None = None) -> RecordedRun:
    tracker = tracker_from_settings(load_settings())
    return record_run(tracker, name, result, {j.id: j for j in jobs}, mode="simulated", start_ms=start_ms, params=params, extra_metrics=extra)


@flow(name="simulate", log_prints=True)
def simulate_flow(
    jobs_file: str,
    gpus: int | None = None,
    policy: str | None = None,
    interval_s: float | None = None,
    overflow: str | None = None,
    react: bool = LoopSettings().react_to_events,
    in_place_cost_s: float = 1.0,
    run_name: str | None = None,
    start_cost_s: float = 0.0,
    parsed: JobsFile | None = None,
    checkpoint_s: float = 0.0,
    checkpoint_every: int = 0,
    teams_file: str | None = None,
) -> SimulateOutcome:
    """Simulate ``jobs_file`` under a policy and record it in MLflow (parent + nested runs).

    ``in_place_cost_s`` / ``start_cost_s``: seconds of progress a job loses per in-place rescale
    and once when it starts (rank launch, rendezvous, final evaluation of a real run);
    ``checkpoint_s`` every ``checkpoint_every`` steps: what a job's checkpoint writes cost it.
    ``parsed``: ``jobs_file`` as the caller already read it (the CLI validates it first), so a
    command parses it once. ``teams_file``: teams share the cluster (the policy inside their
    shares), and the parent run records how fair it was (``fairness_*``, ``team.<name>.*``).
    """
    settings = load_settings(policy=policy, interval_s=interval_s, overflow=overflow)
    jobs, file_gpus, file_policy = step(load_jobs)(jobs_file) if parsed is None else (parsed.jobs, parsed.gpus, parsed.policy)
    capacity = gpus or file_gpus or settings.workers
    chosen = policy or file_policy or settings.policy
    loop_settings = LoopSettings(interval_s=settings.interval_s, overflow=OverflowMode(settings.overflow), react_to_events=react)
    start_ms = int(time.time() * 1000)
    teams = None if teams_file is None else load_teams_file(teams_file)
    result, fairness = step(simulate_loop)(jobs, chosen, capacity, loop_settings, in_place_cost_s, start_cost_s, (checkpoint_s, checkpoint_every), teams)
    name = run_name or f"simulate-{Path(jobs_file).stem}-{chosen}"
    physics = physics_of(jobs).value  # goodput when any job carries a noise scale (allocator.simulator.run)
    recorded = step(record_simulation)(
        name, result, jobs, start_ms, {
            "jobs_file": str(jobs_file), "in_place_cost_s": in_place_cost_s, "start_cost_s": start_cost_s, "physics": physics,
            **({"teams_file": teams_file} if teams_file else {}),
            # the simulator's fidelity switches in force (docs/simulator.md)
            "interval_s": loop_settings.interval_s, "decisions": "ticks, arrivals and completions" if react else "ticks only",
            "react_to_noise": loop_settings.react_to_noise, "noise": "measured", "batch_change_cost_s": RescaleCost().batch_s,
        },
        fairness,
    )  # fmt: skip
    if in_flow_run():  # Prefect artifacts belong to a flow run (flows/prefect_runs.py)
        publish_results(
            "simulate",
            result,
            recorded.outcomes,
            summary_markdown(
                f"Simulated {Path(jobs_file).name} under {chosen} on {capacity} GPUs",
                recorded.outcomes,
                [
                    f"MLflow parent run `{recorded.parent_run}`",
                    f"{physics} physics: avg JCT {recorded.metrics.avg_jct_s or 0:.1f} s, rescales {recorded.metrics.rescales}",
                ],
            ),
        )
    return SimulateOutcome(result, recorded)
