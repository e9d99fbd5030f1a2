"""``malleable serve | submit | jobs | cancel | wait``: the long-lived scheduler and its clients."""

from __future__ import annotations

import json
import logging
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer

from flows.commands.shared.common import settings_or_fail, store_or_fail
from flows.commands.shared.live_cluster import live_gpus
from flows.commands.shared.tables import generations_table, jobs_table
from flows.commands.shared.console import EXIT_FAILED, EXIT_TIMEOUT, console, fail, print_raw


def _read_store(settings, job_id: str | None = None):
    """The store for a read-only command, or None when there is none yet (none is created).
    With no store configured and none made by a local service: one line, exit 2 (issue 35.4)."""
    from flows.commands.shared.common import unconfigured_store_line
    from service.store import StoreMissingError

    line = unconfigured_store_line(settings)
    if line is not None:
        fail(line if job_id is None else f"JOB_ID={job_id!r}: no such job: {line}")
    try:
        return store_or_fail(settings, create=False)
    except StoreMissingError:
        return None


def serve(
    workers: Annotated[int | None, typer.Option("--workers", "-w", help="(Virtual) GPU workers of the embedded cluster (default MALLEABLE_WORKERS).")] = None,
    policy: Annotated[str | None, typer.Option("--policy", "-p", help="Allocation policy (default MALLEABLE_POLICY).")] = None,
    interval: Annotated[float | None, typer.Option("--interval", help="Δ: seconds between re-allocations (default MALLEABLE_INTERVAL_S).")] = None,
    react: Annotated[bool | None, typer.Option("--react/--no-react", help="Re-allocate at once on submissions, completions and worker changes.")] = None,
    teams: Annotated[Path | None, typer.Option("--teams", help="Teams file: quotas or weights and members (default MALLEABLE_TEAMS; unset: no fair sharing).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Dask's own log lines.")] = False,
) -> None:
    """Run the scheduler service until stopped (Ctrl-C / SIGTERM: running jobs checkpoint, the next service resumes them)."""
    from deploy.clusters import connect
    from flows.config.kube import kube_spec
    from service.store.lease import LeaseHeldError
    from service.runner import Service, ServiceConfig
    from service.store import StoreError, StorePermissionError, StoreSettingError

    settings = settings_or_fail(workers=workers, policy=policy, interval_s=interval, react=react, teams=teams)
    if settings.policy.startswith("idle_nodes"):
        # Idle-node policies place jobs on named nodes; the service's Dask workers expose none.
        fail(f"--policy={settings.policy!r}: idle-node policies need node names, which the service's workers do not expose; use `malleable idle-nodes` (or `simulate -p {settings.policy}`) for them")
    from flows.config.teams_file import load_teams_file
    from service.jobs.entrypoints import parse_patterns
    from service.tracking.experiment import artifact_root

    try:  # the teams file before the store: a refused input leaves no store behind
        table = None if settings.teams is None else load_teams_file(settings.teams)
    except ValueError as exc:
        fail(str(exc))
    store_or_fail(settings).close()  # a bad store URL (or :memory:) is one line, exit 2, before any cluster
    try:
        config = ServiceConfig(
            store_url=settings.resolved_job_store,
            checkpoint_root=settings.checkpoint_location("service"),
            policy=settings.policy, interval_s=settings.interval_s, overflow=settings.overflow, react=settings.react,
            poll_s=settings.service_poll_s, checkpoint_every=settings.checkpoint_every, tracking_uri=settings.resolved_tracking_uri,
            experiment=settings.experiment, artifact_location=artifact_root(settings.resolved_tracking_uri, settings.state_dir), state_dir=str(settings.state_dir.resolve()), allowed_entrypoints=parse_patterns(settings.allowed_entrypoints), teams=table,
        )  # fmt: skip
    except ValueError as exc:
        fail(str(exc))
    if not verbose:
        logging.getLogger("distributed").setLevel(logging.ERROR)

    from flows.commands.shared.stop_latch import armed

    # Only now (the input is good): the CLI armed the latch at start; signals are acted on from here.
    latch = armed()
    service_box: list = []

    def say(line: str) -> None:
        from rich.text import Text

        # A Text, not markup: a line may quote a job's name, which is a submitter's free text.
        # Dated: a service runs for days, and its log is read beside others.
        console.print(Text.assemble((time.strftime("%Y-%m-%d %H:%M:%S"), "dim"), " ", line), highlight=False, soft_wrap=True)

    latch.watch(say, on_stop=lambda: None, on_fast_stop=lambda: service_box and service_box[0].fast_stop())

    if config.allowed_entrypoints is None and not config.store_url.startswith("sqlite"):
        say("warning: MALLEABLE_ALLOWED_ENTRYPOINTS is unset: anyone who can write this shared store can make the service run any module on every worker (docs/service.md)")
    kube = kube_spec(settings, settings.workers)
    service = None
    try:
        service = Service(config, say=say, stopping=latch.stopping)
        service.acquire()  # before any cluster starts: a second service exits at once
        service_box.append(service)
        orphan = service.orphaned_cluster() if settings.cluster.value == "local" and not latch.stopping.is_set() else None
        if latch.stopping.is_set():
            pass  # stopped before any cluster started: nothing runs here, nothing to checkpoint
        elif orphan is not None:
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
    except (StorePermissionError, StoreSettingError) as exc:  # the role or the store is wrong for serving: a setting
        fail(str(exc))
    except StoreError as exc:
        fail(str(exc), code=EXIT_FAILED)
    finally:
        if service is not None and service.acquired:
            service.lease.release()  # also when the cluster never came up
        latch.settle()
    say("stopped")


def jobs(
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C (not on a terminal: a table per interval).")] = False,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
    all_jobs: Annotated[bool, typer.Option("--all", help="Also finished, failed, cancelled and dropped jobs.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes with --watch.")] = 1.0,
    generations: Annotated[bool, typer.Option("--generations", help="Also each job's generations: GPUs x batch, predicted and measured samples/s.")] = False,
    usage: Annotated[bool, typer.Option("--usage", help="Per team and submitter: GPU-hours used vs entitled, finish-time fairness ρ, Jain's index.")] = False,
    teams: Annotated[Path | None, typer.Option("--teams", help="With --usage: the service's teams file (default MALLEABLE_TEAMS; unset: one team).")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="With --usage: the cluster's GPUs the shares are of (default: the running service's workers, else the most it ever gave out).")] = None,
) -> None:
    """The service's jobs: state, GPUs, batch, progress, ETA (with --generations: predicted vs measured samples/s).

    With --usage: how fair the sharing among teams has been (GPU-hours used vs entitled, ρ, Jain)."""
    from service.store.records import JobState

    if fmt not in ("table", "json"):
        fail(f"--format={fmt!r}: must be table or json")
    if not (interval > 0 and interval != float("inf")):
        fail(f"--interval={interval!r}: must be a number of seconds > 0")
    if gpus is not None and not 1 <= gpus <= 2**20:  # the same bound as a job's GPUs (service.jobs.limits.MAX_GPUS)
        fail(f"--gpus={gpus}: must be a positive integer, at most {2**20:,}")
    settings = settings_or_fail(teams=teams)
    # The store is closed on the way out, not left to the interpreter's exit: sqlite's last reader
    # checkpoints its write-ahead log and removes it, as a tidy exit should.
    with ExitStack() as closing:
        store = _read_store(settings)
        if store is not None:
            closing.callback(store.close)
        if usage:
            _usage(settings, store, fmt, gpus)
            return
        states = None if all_jobs else [s for s in JobState if not s.terminal]

        def rows():
            nonlocal store
            if store is None:  # nothing submitted yet: an empty list, and no store made for it
                store = _read_store(settings)
                if store is not None:
                    closing.callback(store.close)
            return [] if store is None else store.jobs(states=states)

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

        from flows.commands.shared.ctrl_c import CtrlC

        try:
            with CtrlC() as ctrl_c:
                if not console.is_terminal:
                    # A pipe or a file: a live display would print nothing until it ends; a table per interval.
                    while not ctrl_c.stopped:
                        table = jobs_table(rows())
                        console.print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}", highlight=False, markup=False)
                        console.print(table)
                        console.file.flush()
                        ctrl_c.sleep(interval)
                    return
                with Live(jobs_table(rows()), console=console, refresh_per_second=2) as live:
                    while not ctrl_c.stopped:
                        ctrl_c.sleep(interval)
                        if not ctrl_c.stopped:
                            live.update(jobs_table(rows()))
        except KeyboardInterrupt:
            pass  # a second Ctrl-C during a step
        except BrokenPipeError:
            pass  # `| head`: the reader left


def _usage(settings, store, fmt: str, gpus: int | None) -> None:
    from allocator.fairness.teams import TeamTable
    from flows.commands.shared.fairness_tables import submitters_table, teams_table
    from flows.config.teams_file import load_teams_file
    from service.usage import peak_gpus, service_usage

    try:
        table = TeamTable() if settings.teams is None else load_teams_file(settings.teams)
    except ValueError as exc:
        fail(str(exc))
    if store is None:
        fail(f"--usage: no job store yet at {_where(settings)}")
    capacity, source = (gpus, "--gpus") if gpus is not None else live_gpus(store)
    if capacity is None:
        capacity, source = peak_gpus(store, store.jobs()), "the most GPUs the service gave out at once"
    if capacity < 1:
        fail("--usage: no job has held a GPU yet; give the cluster's size with --gpus")
    report = service_usage(store, table, capacity, settings.policy, settings.interval_s)
    if fmt == "json":
        print(json.dumps({"gpus": capacity, **report.as_dict()}, indent=2))
        return
    console.print(teams_table(report, f"fair shares of {capacity} GPUs ({source}); ρ against each team alone on its share, modelled"))
    console.print(submitters_table(report))


def cancel(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    force: Annotated[bool, typer.Option("--force", help="Also another submitter's job (recorded on the job).")] = False,
) -> None:
    """Cancel jobs: a queued one at once, a running one when the service stops it."""
    from service.client import ServiceClient
    from service.store import NotOwnerError, StorePermissionError, UnknownJobError

    settings = settings_or_fail()
    store = _read_store(settings, job_ids[0])
    if store is None:
        fail(f"JOB_ID={job_ids[0]!r}: no such job (no job store yet at {_where(settings)})")
    # Every id checked before any is cancelled: `cancel ID nope` cancels nothing.
    for job_id in job_ids:
        try:
            store.job(job_id)
        except UnknownJobError:
            fail(f"JOB_ID={job_id!r}: no such job in the store (nothing was cancelled)")
    client = ServiceClient(store)
    if not force:
        for job_id in job_ids:
            try:
                client.cancel_allowed(job_id)
            except NotOwnerError as exc:
                fail(f"{exc} (nothing was cancelled)")
    lines = []
    for job_id in job_ids:
        try:
            row = client.cancel(job_id, force=force)
        except StorePermissionError as exc:
            fail(str(exc))
        lines.append(f"{job_id}\t{row.state.value}" + ("\t(cancel requested)" if not row.state.terminal else "") + "\n")
    print_raw("".join(lines))


def _where(settings) -> str:
    from service.store import redact

    return repr(redact(settings.resolved_job_store))


def wait(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds to wait at most.")] = None,
) -> None:
    """Wait until the jobs end; exit 0 only if all finished."""
    # Exit 0: all finished; 1: one failed, was cancelled or dropped; 2: bad input; 3: --timeout ran out.
    from service.client import ServiceClient
    from service.display import ERROR_CHARS, shown
    from service.store import UnknownJobError

    if timeout is not None and not (0 < timeout < float("inf")):
        fail(f"--timeout={timeout!r}: must be a finite number of seconds > 0")
    settings = settings_or_fail()
    store = _read_store(settings, job_ids[0])
    if store is None:
        fail(f"JOB_ID={job_ids[0]!r}: no such job (no job store yet at {_where(settings)})")
    client = ServiceClient(store)
    try:
        rows = client.wait(job_ids, timeout)
    except UnknownJobError as exc:
        fail(f"JOB_ID={exc.args[0]!r}: no such job in the store")
    except TimeoutError as exc:  # not a failed job: the jobs go on (exit codes: docs/service.md)
        fail(str(exc), code=EXIT_TIMEOUT)
    print_raw("".join(f"{r.id}\t{r.state.value}" + (f"\t{shown(r.error, ERROR_CHARS)}" if r.error else "") + "\n" for r in rows))
    if any(r.state.value != "finished" for r in rows):
        raise typer.Exit(EXIT_FAILED)
