"""``malleable submit``: one job from flags, or a jobs file's jobs, into the service's store.

Admission control before the store (Kubernetes' rule): every flag is checked — the entry
point's form, the allow-list, that its module can be found here, numbers the store can hold —
before anything is opened or written, so a rejected submission is one line, exit 2, no file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from flows.commands.shared.common import configured_store_or_fail, settings_or_fail
from flows.commands.shared.console import err_console, fail, print_raw

# A job field's flag, to name it when a flag's value is out of the field's limit.
_FLAG_OF = {"min_gpus": "--min-gpus", "max_gpus": "--max-gpus", "requested_gpus": "--min-gpus", "priority": "--priority", "total_samples": "--samples"}
# Flags that describe one job: with --file they would be ignored, so they are refused.
_JOB_FLAGS = ("samples", "epochs", "dataset_samples", "min_batch", "max_batch", "min_gpus", "max_gpus", "name", "profile", "priority")


def _profile_for(workload: str, profile: Path | None, settings) -> tuple[object, str | None]:
    """The job's throughput profile (a file, else the newest cached one for the workload, else a
    prior) and a note to print once the job is accepted."""
    from allocator.profiles.io import profile_from_dict

    if profile is not None:
        from flows.config.paths import read_json_file

        try:  # a regular file within the size and depth caps: a FIFO or /dev/zero is one line
            return profile_from_dict(read_json_file(profile, f"--profile={str(profile)!r}: profile"), str(profile)), None
        except ValueError as exc:
            fail(str(exc))
    from service.jobs.priors import cached_profile, prior_profile

    found = cached_profile(settings.profile_cache_dir, workload)
    if found is not None:
        return found, None
    return prior_profile(workload), f"note: no measured profile for {workload!r}: the policy plans with a neutral prior (run `malleable profile {workload}` for a measured one)"


def _check_entrypoint(entrypoint: str, settings, check_import: bool) -> None:
    from service.jobs.entrypoints import not_allowed, not_importable, parse_patterns
    from service.jobs.jobspec import check_workload

    from elastic_tasks.workloads import EXAMPLE_NAMES

    try:
        check_workload(entrypoint)
    except ValueError as exc:
        fail(str(exc))
    if ":" not in entrypoint and entrypoint not in EXAMPLE_NAMES:  # the service's own reading (resolve_workload)
        fail(f"ENTRYPOINT={entrypoint!r}: not a training entry point ('package.module:function') nor a built-in example ({', '.join(sorted(EXAMPLE_NAMES))})")
    why = not_allowed(entrypoint, parse_patterns(settings.allowed_entrypoints))
    if why is not None:
        fail(f"ENTRYPOINT={entrypoint!r}: {why}")
    if check_import and ":" in entrypoint:
        why = not_importable(entrypoint)
        if why is not None:
            fail(f"ENTRYPOINT={entrypoint!r}: {why} (the service could not run it; --no-import-check if only the service can import it)")


def _work(samples: int | None, epochs: float | None, dataset_samples: int | None) -> int:
    """The job's samples from --samples or --epochs x --dataset-samples, within what a job may hold."""
    from service.jobs.jobspec import MAX_SAMPLES

    if (samples is None) == (epochs is None):
        fail("give --samples or --epochs (with --dataset-samples)")
    if samples is not None:
        if not 1 <= samples <= MAX_SAMPLES:
            fail(f"--samples={samples}: must be in [1, {MAX_SAMPLES:.0e}] (a sane maximum; the store holds integers up to 2^63-1)")
        return samples
    if not (math.isfinite(epochs) and epochs > 0):
        fail(f"--epochs={epochs!r}: must be a finite number > 0")
    if dataset_samples is None:
        fail("--epochs needs --dataset-samples")
    if not 1 <= dataset_samples <= MAX_SAMPLES:
        fail(f"--dataset-samples={dataset_samples}: must be in [1, {MAX_SAMPLES:.0e}]")
    total = epochs * dataset_samples
    if not 1 <= total <= MAX_SAMPLES:
        fail(f"--epochs={epochs!r} x --dataset-samples={dataset_samples}: {total:.3g} samples, must be in [1, {MAX_SAMPLES:.0e}]")
    return max(1, round(total))


def _placement_problems(store, specs) -> list[str]:
    """Why the running service could never place each job that it could not (it needs more GPUs
    at its smallest than the service's cluster has). No running service: nothing is checked."""
    from flows.commands.shared.live_cluster import live_gpus
    from service.jobs.limits import placement_problem

    gpus, _ = live_gpus(store)
    problems = [placement_problem(spec, gpus) for spec in specs]
    return [f"{why} (--no-placement-check to queue it for a cluster that will grow)" for why in problems if why is not None]


def _fail_each(lines: list[str]) -> None:
    """Every refused job on its own line (stderr), exit 2: a jobs file's problems all at once."""
    if not lines:
        return
    for line in lines[:-1]:
        err_console.print(f"error: {line}", highlight=False, markup=False, soft_wrap=True)
    fail(lines[-1])


def _submit_file(file: Path, key: str | None, settings, placement_check: bool) -> None:
    from flows.config.jobfile import load_jobs_file
    from service.client import ServiceClient
    from service.jobs.jobspec import check_submission
    from service.store import IdempotencyConflict, StorePermissionError

    try:
        specs = load_jobs_file(file).jobs
    except ValueError as exc:
        fail(f"{file}: {exc}" if str(file) not in str(exc) else str(exc))
    refused = []
    for spec in specs:  # the one validator of flags, files, the client and the service; every job's problem, one line each
        try:
            check_submission(spec)
        except ValueError as exc:
            refused.append(f"{file}: {exc}")
    _fail_each(refused)
    from service.jobs.entrypoints import not_allowed, parse_patterns

    for spec in specs:
        why = not_allowed(spec.workload, parse_patterns(settings.allowed_entrypoints))
        if why is not None:
            fail(f"{file}: job {spec.id!r}.workload={spec.workload!r}: {why}")
    store = configured_store_or_fail(settings)
    if placement_check:
        problems = _placement_problems(store, specs)
        if problems:
            store.close()
            _fail_each([f"{file}: {why}" for why in problems])
    client = ServiceClient(store)
    try:
        done = client.submit_specs(specs, key_prefix=key)
    except (IdempotencyConflict, StorePermissionError) as exc:
        fail(str(exc))
    # Raw tab-separated lines (not through rich, which turns tabs into spaces): `cut -f1` works.
    print_raw("".join(f"{s.job_id}\t{spec.id}" + ("" if s.created else "\t(already submitted)") + "\n" for spec, s in zip(specs, done, strict=True)))


def submit(
    ctx: typer.Context,
    entrypoint: Annotated[str | None, typer.Argument(help="What to train: package.module:function or an example name.")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Submit every job of a jobs file instead (arrival times are ignored).")] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Work in samples.")] = None,
    epochs: Annotated[float | None, typer.Option("--epochs", help="Work in epochs of --dataset-samples.")] = None,
    dataset_samples: Annotated[int | None, typer.Option("--dataset-samples", help="Samples per epoch (with --epochs).")] = None,
    min_batch: Annotated[int, typer.Option("--min-batch", help="Smallest global batch.")] = 32,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Largest global batch.")] = 256,
    min_gpus: Annotated[int, typer.Option("--min-gpus", help="Fewest GPUs.")] = 1,
    max_gpus: Annotated[int, typer.Option("--max-gpus", help="Most GPUs.")] = 4,
    name: Annotated[str | None, typer.Option("--name", help="A name to show beside the job id.")] = None,
    priority: Annotated[str, typer.Option("--priority", help="Priority class (best-effort, default, nightly) or an integer: who goes first and yields last in your team.")] = "default",
    profile: Annotated[Path | None, typer.Option("--profile", help="Throughput profile JSON (default: the newest cached one, else a prior).")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Idempotency key: a retry with the same key returns the same job; another job under it is refused.")] = None,
    import_check: Annotated[bool, typer.Option("--import-check/--no-import-check", help="Refuse an entry point whose module cannot be found here.")] = True,
    placement_check: Annotated[bool, typer.Option("--placement-check/--no-placement-check", help="Refuse a job that needs more GPUs than the running service has.")] = True,
) -> None:
    """Submit one job (from flags) or a jobs file's jobs to the service; prints the job ids."""
    settings = settings_or_fail()
    if (entrypoint is None) == (file is None):
        fail("give an ENTRYPOINT or --file JOBS, not both and not neither")
    if key is not None and not 1 <= len(key) <= 200:
        fail(f"--key={key[:40]!r}: must be 1 to 200 characters")
    if key is not None and any(not c.isprintable() for c in key):
        fail(f"--key={key[:40]!r}: holds control characters (newlines, escapes); use printable text")
    if file is not None:
        # By the source's name: typer vendors its own click, whose enum is not click's.
        given = [n for n in _JOB_FLAGS if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE"]
        if given:
            flag = "--" + given[0].replace("_", "-")
            fail(f"{flag}={ctx.params[given[0]]!s}: describes one job and cannot go with --file={str(file)!r} (put it in the jobs file)")
        _submit_file(file, key, settings, placement_check)
        return
    from service.jobs.limits import check_name

    try:
        check_name(name, "--name")
    except ValueError as exc:
        fail(str(exc))
    _check_entrypoint(entrypoint, settings, import_check)
    total = _work(samples, epochs, dataset_samples)
    from allocator.types import JobSpec
    from service.client import ServiceClient
    from service.jobs.jobspec import check_submission
    from service.store import IdempotencyConflict, StorePermissionError

    from allocator.fairness.priority import priority_value

    try:
        level = priority_value(int(priority) if priority.lstrip("-").isdigit() else priority, "--priority")
    except ValueError as exc:
        fail(str(exc))
    found, note = _profile_for(entrypoint, profile, settings)
    from service.jobs.limits import JobFieldError

    try:  # parsed here, once: the client stores this JobSpec as it is
        spec = check_submission(JobSpec(
            id=entrypoint.rsplit(":", 1)[-1], workload=entrypoint, profile=found, total_samples=total,
            min_batch=min_batch, max_batch=max_batch, min_gpus=min_gpus, max_gpus=max_gpus, priority=level,
        ))  # fmt: skip
    except JobFieldError as exc:  # the same limit as a jobs file's, named by its flag
        flag = _FLAG_OF.get(exc.field)
        fail(f"{flag}={exc.value}: {exc.why} ({exc})" if flag else str(exc))
    except ValueError as exc:
        fail(str(exc))
    store = configured_store_or_fail(settings)  # only now: a rejected job leaves no store behind
    if placement_check:
        problems = _placement_problems(store, [spec])
        if problems:
            store.close()
            fail(problems[0])
    try:
        submitted = ServiceClient(store).submit_spec(spec, name=name, idempotency_key=key)
    except (ValueError, IdempotencyConflict, StorePermissionError) as exc:
        fail(str(exc))
    if note is not None and submitted.created:
        # stderr: stdout is the job id alone (`id=$(malleable submit ...)`).
        err_console.print(note, highlight=False, markup=False)
    print_raw(submitted.job_id + ("" if submitted.created else "\t(already submitted)") + "\n")
