"""``malleable simulate``: a jobs file or trace through the shared loop, or a seed paper's experiment.

Each ``-p`` is one policy variant, ``NAME`` or ``NAME:KEY=VALUE,...``, one labelled row (the
work is ``flows.simulation``); ``--rerun SUMMARY`` runs a ``summary.json`` again from what it
recorded and says whether every schedule came out the same.
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from allocator.admission import OverflowMode
from allocator.loop import LoopSettings
from allocator.policies import UnknownPolicyError
from allocator.simulator import RescaleCost
from allocator.simulator.run import check_physics
from allocator.simulator.experiments import EXPERIMENTS, SEED000_INTERVAL_S
from allocator.types import JobSpec
from allocator.workloads.seed000 import load_category_profiles
from allocator.workloads.trace import TraceError
from flows.idle_replay import replay_idle_nodes
from flows.commands.shared.console import EXIT_FAILED, console, fail
from flows.config.paths import check_output_dir
from flows.config.teams_file import load_teams_file
from flows.simulation.choices import policy_variants
from flows.simulation.experiment_run import run_experiment
from flows.simulation.provenance import SimInputs, SimSettings, read_summary
from flows.simulation.trace_run import reproduced, run_variants
from flows.simulation.workload import read_workload

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


def load_workload(path: Path, profiles_dir: Path, envelope: bool = False, noise: Path | None = None) -> tuple[list[JobSpec], int | None, dict[str, Path]]:
    """``flows.simulation.workload.load_workload``, saying which profiles a trace took."""
    loaded = read_workload(path, profiles_dir, envelope, noise)
    if loaded.profile_files:  # said only once the trace is good: a rejected one prints its one error line alone
        console.print(f"profiles from {profiles_dir}: {', '.join(sorted(loaded.profiles))}" + (" (monotone envelope)" if envelope else ""))
    return loaded.jobs, loaded.gpus, loaded.profile_files


def simulate_command(
    workload: Annotated[Path | None, typer.Argument(help="Jobs file (YAML/JSON) or trace (CSV/JSON list).")] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", "-e", help=f"Named experiment: {', '.join(EXPERIMENTS)}.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", help="Cluster size (default: the jobs file's).")] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help="Policy, or a variant NAME:KEY=VALUE[,KEY=VALUE...] (e.g. goodput_dp:p=-1,remaining_exponent=0); repeat to compare, one labelled row each (default elastic_dp)."),
    ] = None,
    interval: Annotated[float, typer.Option("--interval", help="Δ: seconds between re-allocations.")] = SEED000_INTERVAL_S,
    react: Annotated[bool, typer.Option("--react/--no-react", help="Also re-allocate on every arrival/completion (the loop's default); --no-react: at Δ ticks only.")] = DEFAULT_REACT,
    react_to_noise: Annotated[
        bool, typer.Option("--react-to-noise/--no-react-to-noise", help="At a tick, decide again when a running job's noise scale moved (the loop's default).")
    ] = DEFAULT_LOOP.react_to_noise,
    measured_noise: Annotated[
        bool,
        typer.Option("--measured-noise/--modelled-noise", help="Jobs report their noise scale as trainers measure it (default), or the policy reads its model at the declared progress."),
    ] = True,
    gpus_per_host: Annotated[
        int | None,
        typer.Option("--gpus-per-host", help="Goodput physics: jobs pay the inter-host allreduce of their profile across hosts of this many GPUs (default: one flat network); a policy's own hosts must match."),
    ] = None,
    overflow: Annotated[OverflowMode, typer.Option("--overflow", help="What happens to jobs that do not fit.")] = OverflowMode.QUEUE,
    strict_fifo: Annotated[
        bool | None,
        typer.Option("--strict-fifo/--backfill", help="Queue discipline: the first job that does not fit blocks the rest, or later jobs that fit pass it. Default: each policy's own (fixed_batch backfills; the loop admits strictly)."),
    ] = None,
    param: Annotated[list[str] | None, typer.Option("--param", help="Policy parameter [POLICY:]KEY=VALUE for every variant of POLICY that does not set it, repeatable (e.g. fixed_batch_dp:batch_choice=random).")] = None,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per experiment setting (0..N-1).")] = 3,
    in_place_cost: Annotated[float, typer.Option("--in-place-cost", help="Seconds lost per in-place rescale.")] = DEFAULT_COST.in_place_s,
    restart_cost: Annotated[float, typer.Option("--restart-cost", help="Seconds lost per checkpoint-restart rescale.")] = DEFAULT_COST.restart_s,
    rescale: Annotated[RescaleMode, typer.Option("--rescale", help="How a running job changes GPUs: in-place (costs --in-place-cost) or restart (--restart-cost).")] = RescaleMode.IN_PLACE,
    start_cost: Annotated[float, typer.Option("--start-cost", help="Seconds a job loses once when it starts (launch, rendezvous).")] = DEFAULT_COST.start_s,
    batch_cost: Annotated[float, typer.Option("--batch-cost", help="Seconds a batch-only change (same GPUs, new batch or accumulation) costs: applied at a step boundary, no regroup.")] = DEFAULT_COST.batch_s,
    noise: Annotated[
        Path | None,
        typer.Option("--noise", help="JSON/YAML mapping name -> noise_scale (any jobs-file form): by job id or workload, or named by a trace's noise_scale cell. A job with a different noise scale of its own is refused."),
    ] = None,
    profiles: Annotated[Path, typer.Option("--profiles", help="Directory of profile JSON files: yours (a trace's profile/model column names the file stem) or seed000_cat*.json (category N).")] = DEFAULT_PROFILES,
    monotone_envelope: Annotated[bool, typer.Option("--monotone-envelope", help="Raise measured iteration times that dip below a smaller batch's to that time (noise) instead of refusing the profile.")] = False,
    teams: Annotated[Path | None, typer.Option("--teams", help="Teams file (quotas or weights, members): fair shares among teams, and how fair each run was (docs/policies.md).")] = None,
    fairness: Annotated[bool, typer.Option("--fair/--no-fair", help="With --teams: each policy inside the teams' shares, or the policy alone with the teams only measured.")] = True,
    rerun: Annotated[Path | None, typer.Option("--rerun", help="A summary.json to run again from what it recorded (inputs, settings, every parameter); says whether each schedule came out the same.")] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Draw the PNG plots.")] = True,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for CSVs, plots and summaries.")] = Path("out/simulate"),
) -> None:
    """Simulate a cluster with the same autoscaling loop a real run uses.

    Idle-node policies (``idle_nodes_*``, seed 003) replay a trace of nodes that come and go
    instead: ``simulate [TRACE.csv] -p idle_nodes_milp`` runs ``malleable idle-nodes`` on it.
    """
    if rerun is not None:
        if workload is not None or experiment is not None or policy:
            fail("--rerun takes everything from the summary: give no WORKLOAD, --experiment or --policy with it")
        _rerun(rerun, out, plots)
        return
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
            run_experiment(experiment, tuple(range(seeds)), interval, cost, profiles, out, plots)
            return
        assert workload is not None
        jobs, file_gpus, profile_files = load_workload(workload, profiles, monotone_envelope, noise)
        if teams is not None:
            load_teams_file(teams)  # a bad teams file fails here, before any work
        capacity = gpus if gpus is not None else file_gpus
        if capacity is None or capacity <= 0:
            fail(f"gpus={capacity}: give a positive --gpus (or 'gpus' in the jobs file)")
        if gpus_per_host is not None and gpus_per_host < 1:
            fail(f"--gpus-per-host={gpus_per_host}: must be a positive integer")
        variants = policy_variants(policy or ["elastic_dp"], param or [], strict_fifo)
        for variant in variants:
            check_physics(variant.build(), jobs, gpus_per_host)  # fail fast on a bad name or value, before any work
        loop = LoopSettings(
            interval_s=interval, overflow=overflow, react_to_events=react, react_to_noise=react_to_noise,
            strict_fifo=DEFAULT_LOOP.strict_fifo if strict_fifo is None else strict_fifo,
        )  # fmt: skip
        check_output_dir(out, "--out")
        out.mkdir(parents=True, exist_ok=True)
        settings = SimSettings(capacity, loop, cost, measured_noise, gpus_per_host, fairness if teams is not None else None)
        run_variants(jobs, variants, settings, SimInputs(workload, profiles, monotone_envelope, noise, teams), out, plots, profile_files)
    except (UnknownPolicyError, TraceError) as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc))
    except OSError as exc:  # the checks passed but writing failed: a full disk, a vanished directory
        fail(f"--out={str(out)!r}: cannot write {exc.filename or ''} ({exc.strerror or exc})", code=EXIT_FAILED)


def _rerun(summary: Path, out: Path, plots: bool) -> None:
    try:
        again = read_summary(summary)
        if out.resolve() == summary.resolve().parent:
            fail(f"--out={str(out)!r}: is where {summary.name} and its schedules are; rerun into another directory")
        inputs = again.inputs
        jobs, _, profile_files = load_workload(inputs.workload, inputs.profiles, inputs.monotone_envelope, inputs.noise)
        for variant in again.variants:
            check_physics(variant.build(), jobs, again.settings.gpus_per_host)
        check_output_dir(out, "--out")
        out.mkdir(parents=True, exist_ok=True)
        data = run_variants(jobs, list(again.variants), again.settings, inputs, out, plots, profile_files)
    except (UnknownPolicyError, TraceError, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"--out={str(out)!r}: cannot write {exc.filename or ''} ({exc.strerror or exc})", code=EXIT_FAILED)
    differ = reproduced(data, again.schedules)
    if differ:
        fail(f"rerun of {summary}: the schedule of {', '.join(differ)} differs from the one recorded", code=EXIT_FAILED)
    console.print(f"rerun of {summary}: all {len(again.schedules)} schedule(s) identical to the recorded ones")
