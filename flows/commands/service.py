"""``malleable serve | submit | jobs | cancel | wait``: the long-lived scheduler and its clients."""

from __future__ import annotations

import json
import logging
import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from flows.commands.common import settings_or_fail
from flows.commands.tables import generations_table, jobs_table
from flows.commands.console import EXIT_FAILED, console, fail


def _store(settings):
    from service.store import JobStore, StoreError

    try:
        return JobStore(settings.resolved_job_store)
    except StoreError as exc:
        fail(str(exc), code=EXIT_FAILED)


def serve(
    workers: Annotated[int | None, typer.Option("--workers", "-w", help="(Virtual) GPU workers of the embedded cluster (default MALLEABLE_WORKERS).")] = None,
    policy: Annotated[str | None, typer.Option("--policy", "-p", help="Allocation policy (default MALLEABLE_POLICY).")] = None,
    interval: Annotated[float | None, typer.Option("--interval", help="Δ: seconds between re-allocations (default MALLEABLE_INTERVAL_S).")] = None,
    react: Annotated[bool | None, typer.Option("--react/--no-react", help="Re-allocate at once on submissions, completions and worker changes.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Dask's own log lines.")] = False,
) -> None:
    """Run the scheduler service until stopped (Ctrl-C / SIGTERM: running jobs checkpoint, the next service resumes them)."""
    from deploy.clusters import connect
    from flows.config.kube import kube_spec
    from service.lease import LeaseHeldError
    from service.runner import Service, ServiceConfig
    from service.store import StoreError

    settings = settings_or_fail(workers=workers, policy=policy, interval_s=interval, react=react)
    try:
        config = ServiceConfig(
            store_url=settings.resolved_job_store,
            checkpoint_root=settings.checkpoint_location("service"),
            policy=settings.policy, interval_s=settings.interval_s, overflow=settings.overflow, react=settings.react,
            poll_s=settings.service_poll_s, checkpoint_every=settings.checkpoint_every, tracking_uri=settings.resolved_tracking_uri,
            experiment=settings.experiment,
        )  # fmt: skip
    except ValueError as exc:
        fail(str(exc))
    if not verbose:
        logging.getLogger("distributed").setLevel(logging.ERROR)

    def say(line: str) -> None:
        console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {line}", highlight=False, soft_wrap=True)

    kube = kube_spec(settings, settings.workers)
    service = None
    try:
        service = Service(config, say=say)
        service.acquire()  # before any cluster starts: a second service exits at once

        def on_signal(signum, _frame) -> None:
            say(f"{signal.Signals(signum).name}: stopping (running jobs checkpoint first)")
            service.stop()
            signal.signal(signum, signal.SIG_DFL)  # a second one ends at once

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        orphan = service.orphaned_cluster() if settings.cluster.value == "local" else None
        if orphan is not None:
            # The crashed service's own cluster is still up: adopt it (and shut it down at the end).
            from distributed import Client

            say(f"adopting the previous service's cluster at {orphan}")
            with Client(orphan, set_as_default=False) as client:
                try:
                    service.run(client, cluster_owned=True)
                finally:
                    client.shutdown()
        else:
            with connect(settings.cluster.value, workers=settings.workers, address=settings.scheduler_address, kube=kube) as client:
                service.run(client, cluster_owned=settings.cluster.value != "address")
    except LeaseHeldError as exc:
        fail(str(exc), code=EXIT_FAILED)
    except StoreError as exc:
        fail(str(exc), code=EXIT_FAILED)
    finally:
        if service is not None:
            service.lease.release()  # also when the cluster never came up
    say("stopped")


def _profile_for(workload: str, profile: Path | None, settings):
    """The job's throughput profile: a file, else the newest cached one for the workload, else a prior."""
    from allocator.profile_io import profile_from_dict

    if profile is not None:
        try:
            return profile_from_dict(json.loads(profile.read_text()), str(profile))
        except (OSError, json.JSONDecodeError) as exc:
            fail(f"--profile {str(profile)!r}: cannot read a profile JSON ({exc})")
        except ValueError as exc:
            fail(str(exc))
    from service.priors import cached_profile, prior_profile

    found = cached_profile(settings.profile_cache_dir, workload)
    if found is not None:
        return found
    console.print(f"note: no measured profile for {workload!r}: the policy plans with a neutral prior (run `malleable profile {workload}` for a measured one)", highlight=False, markup=False)
    return prior_profile(workload)


def submit(
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
    profile: Annotated[Path | None, typer.Option("--profile", help="Throughput profile JSON (default: the newest cached one, else a prior).")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Idempotency key: a retry with the same key returns the same job.")] = None,
) -> None:
    """Submit one job (from flags) or a jobs file's jobs to the service; prints the job ids."""
    from service.client import ServiceClient

    settings = settings_or_fail()
    if (entrypoint is None) == (file is None):
        fail("give an ENTRYPOINT or --file JOBS, not both and not neither")
    if file is not None:
        from flows.config.jobfile import load_jobs_file

        try:
            specs = load_jobs_file(file).jobs
        except ValueError as exc:
            fail(str(exc))
        client = ServiceClient(_store(settings))
        done = client.submit_specs(specs, key_prefix=key)
        for spec, s in zip(specs, done, strict=True):
            console.print(f"{s.job_id}\t{spec.id}" + ("" if s.created else "\t(already submitted)"), highlight=False, markup=False)
        return
    if (samples is None) == (epochs is None):
        fail("give --samples or --epochs (with --dataset-samples)")
    entry: dict = {
        "id": name or entrypoint.rsplit(":", 1)[-1],
        "workload": entrypoint,
        "min_batch": min_batch, "max_batch": max_batch, "min_gpus": min_gpus, "max_gpus": max_gpus,
    }  # fmt: skip
    if samples is not None:
        entry["samples"] = samples
    else:
        if dataset_samples is None:
            fail("--epochs needs --dataset-samples")
        entry["epochs"], entry["dataset_samples"] = epochs, dataset_samples
    from allocator.profile_io import profile_to_dict
    from allocator.specs import job_from_dict

    entry["profile"] = profile_to_dict(_profile_for(entrypoint, profile, settings))
    try:
        entry = {k: v for k, v in entry.items() if k not in ("epochs", "dataset_samples")} | {"samples": job_from_dict(entry, 0, {}).total_samples}
        submitted = ServiceClient(_store(settings)).submit(entry, name=name, idempotency_key=key)
    except ValueError as exc:
        fail(str(exc).replace("(jobs[0])", "").strip())
    console.print(submitted.job_id + ("" if submitted.created else "\t(already submitted)"), highlight=False, markup=False)


def jobs(
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C (not on a terminal: a table per interval).")] = False,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    all_jobs: Annotated[bool, typer.Option("--all", help="Also finished, failed, cancelled and dropped jobs.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes with --watch.")] = 1.0,
    generations: Annotated[bool, typer.Option("--generations", help="Also each job's generations: GPUs x batch, predicted and measured samples/s.")] = False,
) -> None:
    """The service's jobs: state, GPUs, batch, progress, ETA (with --generations: predicted vs measured samples/s)."""
    from service.records import JobState

    if fmt not in ("table", "json"):
        fail(f"--format={fmt!r}: must be table or json")
    if not (interval > 0 and interval != float("inf")):
        fail(f"--interval={interval!r}: must be a number of seconds > 0")
    settings = settings_or_fail()
    store = _store(settings)
    states = None if all_jobs else [s for s in JobState if not s.terminal]

    def rows():
        return store.jobs(states=states)

    if fmt == "json":
        out = [
            {"id": r.id, "name": r.name, "state": r.state.value, "gpus": r.gpus, "batch": r.batch, "progress": round(r.progress, 4),
             "submitter": r.submitter, "submitted_at": r.submitted_at, "started_at": r.started_at, "finished_at": r.finished_at,
             "error": r.error, "attempts": r.attempts, "mlflow_run_id": r.mlflow_run_id,
             "steps": r.steps, "final_loss": r.final_loss, "eval_loss": r.eval_loss, "wall_split": r.wall_split,
             "generations": [
                 {"time": a.time, "gpus": a.gpus, "batch": a.batch, "kind": a.kind,
                  "predicted_samples_per_s": a.predicted_samples_per_s, "measured_samples_per_s": a.measured_samples_per_s}
                 for a in store.allocations(r.id) if a.gpus > 0
             ]}
            for r in rows()
        ]  # fmt: skip
        print(json.dumps(out, indent=2))
        return
    if not watch:
        listed = rows()
        console.print(jobs_table(listed))
        for r in listed if generations else ():
            console.print(generations_table(r.id, store.allocations(r.id)))
        return
    from rich.live import Live

    try:
        if not console.is_terminal:
            # A pipe or a file: a live display would print nothing until it ends; a table per interval.
            while True:
                console.print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}", highlight=False, markup=False)
                console.print(jobs_table(rows()))
                console.file.flush()
                time.sleep(interval)
        with Live(jobs_table(rows()), console=console, refresh_per_second=2) as live:
            while True:
                time.sleep(interval)
                live.update(jobs_table(rows()))
    except KeyboardInterrupt:
        pass


def cancel(job_ids: Annotated[list[str], typer.Argument(help="Job ids.")]) -> None:
    """Cancel jobs: a queued one at once, a running one when the service stops it."""
    from service.store import UnknownJobError

    store = _store(settings_or_fail())
    for job_id in job_ids:
        try:
            row = store.request_cancel(job_id)
        except UnknownJobError as exc:
            fail(str(exc))
        console.print(f"{job_id}\t{row.state.value}" + ("\t(cancel requested)" if not row.state.terminal else ""), highlight=False, markup=False)


def wait(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds to wait at most.")] = None,
) -> None:
    """Wait until the jobs end; exit 0 only if all finished."""
    from service.client import ServiceClient
    from service.store import UnknownJobError

    if timeout is not None and not (0 < timeout < float("inf")):
        fail(f"--timeout={timeout!r}: must be a finite number of seconds > 0")
    client = ServiceClient(_store(settings_or_fail()))
    try:
        rows = client.wait(job_ids, timeout)
    except UnknownJobError as exc:
        fail(str(exc))
    except TimeoutError as exc:
        fail(str(exc), code=EXIT_FAILED)
    for r in rows:
        console.print(f"{r.id}\t{r.state.value}" + (f"\t{r.error}" if r.error else ""), highlight=False, markup=False)
    if any(r.state.value != "finished" for r in rows):
        raise typer.Exit(EXIT_FAILED)
