"""``malleable profile``: measure a training entry point into a ThroughputProfile (table + JSON)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from allocator.profiles.io import profile_to_dict
from allocator.physics.throughput import t_comm
from elastic_tasks.profiling.cache import ProfileCache
from elastic_tasks.profiling.noise_trajectory import NoiseMeasurement, measure_noise_trajectory
from elastic_tasks.profiling.settings import ProfilerError, ProfileSettings
from elastic_tasks.profiling.profiler import ProfileReport, profile_cached
from elastic_tasks.recipe import load_entry_point
from flows.commands.shared.common import settings_or_fail
from flows.commands.shared.console import EXIT_FAILED, console, fail
from flows.config.paths import check_output_dir, check_output_file


def parse_int_list(option: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{option}={text!r}: expected comma-separated integers, e.g. 8,16,32") from None
    if not values:
        raise ValueError(f"{option}={text!r}: expected at least one integer")
    return values


def _tables(report: ProfileReport) -> list[Table]:
    prof = report.profile
    source = "cached" if report.from_cache else "measured"
    compute = Table(title=f"{prof.workload}: {prof.num_params:,} parameters on {prof.hardware} ({source})")
    for col in ("per-GPU batch", "iter time (ms)", "samples/s"):
        compute.add_column(col, justify="right")
    for b, t in zip(prof.batch_sizes, prof.iter_times_s):
        compute.add_row(str(b), f"{t * 1e3:.2f}", f"{b / t:,.1f}")
    tables = [compute]
    if report.allreduce_samples:
        comm = Table(
            title=(
                f"allreduce fit: latency {prof.allreduce.latency_s * 1e6:.1f} us, "
                f"{prof.allreduce.seconds_per_param * 1e9:.3f} ns/param"
            )
        )
        for col in ("parameters", "workers", "measured (ms)", "fit (ms)"):
            comm.add_column(col, justify="right")
        for s in report.allreduce_samples:
            comm.add_row(f"{s.params:,}", str(s.gpus), f"{s.seconds * 1e3:.2f}", f"{t_comm(prof.allreduce, s.params, s.gpus) * 1e3:.2f}")
        tables.append(comm)
    return tables


def _noise_table(m: NoiseMeasurement) -> Table:
    table = Table(title=f"gradient noise scale over {m.steps} steps at batch {m.batch} (micro-batches of {m.micro_batch}), {m.seconds:.0f} s")
    for col in ("fraction of run", "B_noise", "training loss"):
        table.add_column(col, justify="right")
    for f, v, loss in zip(m.fractions, m.noise_scale, m.loss):
        table.add_row(f"{f:.2f}", f"{v:,.1f}", f"{loss:.4f}")
    return table


def profile_command(
    entrypoint: Annotated[str, typer.Argument(help="Training entry point 'package.module:function' returning a TrainingRecipe.")],
    batches: Annotated[str, typer.Option("--batches", "-b", help="Per-GPU batch ladder, comma-separated.")] = "8,16,32,64",
    gpus_for_allreduce: Annotated[str, typer.Option("--gpus-for-allreduce", help="Worker counts to time allreduce on (1 = none).")] = "2",
    allreduce_params: Annotated[str | None, typer.Option("--allreduce-params", help="Parameter counts to time (default: 1/8, 1/2, all of the model's).")] = None,
    max_batch: Annotated[int | None, typer.Option("--max-batch", help="Memory cap per GPU (CPU default: largest ladder batch; CUDA default: probed).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed iterations per batch (median taken).")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed iterations before timing each batch.")] = 2,
    device: Annotated[str | None, typer.Option("--device", help="cpu or cuda[:N] (default: what a rank here trains on: cuda:0 when CUDA is present, else cpu).")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="torch intra-op threads while measuring (default: torch's).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds for process-group init and each collective.")] = 120.0,
    include_data: Annotated[bool, typer.Option("--include-data/--compute-only", help="Time batch collation with each iteration, as the trainer does (default), or compute only (seed 000's t_proc).")] = True,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the profile JSON here.")] = None,
    cache_dir: Annotated[
        Path | None, typer.Option("--cache-dir", help="Reuse/store profiles keyed by model and hardware (default: <state dir>/profiles, where `submit` looks).")
    ] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="Measure even if the cache holds this profile.")] = False,
    noise: Annotated[bool, typer.Option("--noise/--no-noise", help="Also measure the gradient noise scale over a training run and write it as the profile's noise_scale.")] = False,
    noise_batch: Annotated[int | None, typer.Option("--noise-batch", help="Global batch of the noise run (default: the recipe's base_batch).")] = None,
    noise_micro: Annotated[int | None, typer.Option("--noise-micro", help="Micro-batch of the noise run (default: a quarter of --noise-batch).")] = None,
    noise_epochs: Annotated[float, typer.Option("--noise-epochs", help="Epochs of the noise run: about a job's own length (fractions are of this run).")] = 1.0,
    noise_points: Annotated[int, typer.Option("--noise-points", help="Points of the trajectory, evenly spaced over the run.")] = 10,
) -> None:
    """Measure per-iteration time over a batch ladder and allreduce time; print and save the profile."""
    try:
        if device is None:
            from elastic_tasks.devices import default_backend, rank_device

            device = str(rank_device(default_backend()))
        settings = ProfileSettings(
            batch_sizes=parse_int_list("--batches", batches),
            warmup=warmup,
            repeats=repeats,
            max_batch_per_gpu=max_batch,
            allreduce_gpus=parse_int_list("--gpus-for-allreduce", gpus_for_allreduce),
            allreduce_params=None if allreduce_params is None else parse_int_list("--allreduce-params", allreduce_params),
            timeout_s=timeout,
            device=device,
            threads=threads,
            include_data=include_data,
        )
        if cache_dir is None:
            cache_dir = settings_or_fail().profile_cache_dir  # one cache: `submit`, the client and the retrain flow read it
        check_output_dir(cache_dir, "--cache-dir")
        if out is not None:
            check_output_file(out, "--out")
        if not (noise_epochs > 0):
            raise ValueError(f"--noise-epochs={noise_epochs}: must be > 0")
        recipe = load_entry_point(entrypoint)
        report = profile_cached(recipe, settings, ProfileCache(cache_dir), refresh=refresh)
        measured = None
        profile = report.profile
        if noise:
            batch = recipe.base_batch if noise_batch is None else noise_batch
            micro = max(1, batch // 4) if noise_micro is None else noise_micro
            measured = measure_noise_trajectory(recipe, batch, micro, noise_epochs, noise_points, device=device)
            profile = dataclasses.replace(profile, noise_scale=measured.trajectory)
    except ProfilerError as exc:
        fail(str(exc), code=EXIT_FAILED)
    except ValueError as exc:  # EntryPointError is a ValueError
        fail(str(exc))
    for table in _tables(report) + ([_noise_table(measured)] if measured is not None else []):
        console.print(table)
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(profile_to_dict(profile), indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            fail(f"--out={str(out)!r}: cannot write ({exc.strerror})", code=EXIT_FAILED)
        console.print(f"profile written to {out}")
