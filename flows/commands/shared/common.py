"""Helpers shared by this package's CLI commands: settings that fail as one line."""

from __future__ import annotations

import asyncio
from pathlib import Path

from flows.commands.shared.console import EXIT_FAILED, console, fail
from flows.config.settings import ClusterKind, Settings, SettingsError, load_settings


# Settings fields that commands take as flags: an error in a value given that way names the flag.
_FLAGS = {"interval_s": "--interval", "workers": "--workers", "policy": "--policy"}


def settings_or_fail(**overrides: object) -> Settings:
    """Load settings (flags win over ``MALLEABLE_*``); a bad value exits 2 with one line."""
    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        message = str(exc)
        field = message.partition("=")[0]
        fail(_FLAGS[field] + message[len(field) :] if field in _FLAGS else message)


def prefect_state_or_fail() -> None:
    """A damaged local Prefect database exits 2 with one line naming it, before any flow starts."""
    from flows.config.local_state import DamagedStateError, check_prefect_database

    try:
        check_prefect_database()
    except DamagedStateError as exc:
        fail(str(exc))


def scheduler_or_fail(settings: Settings, timeout_s: float = 3.0) -> None:
    """With cluster=address, a Dask scheduler must answer there within seconds.

    distributed's Client would retry for its connect timeout (30 s by default) and then
    print a long traceback; one connect with Dask's handshake says the same thing now, in
    one line (a plain TCP connect is not enough: something else may listen on that port).
    """
    if settings.cluster is not ClusterKind.ADDRESS or not settings.scheduler_address:
        return
    address = settings.scheduler_address
    from distributed.comm import connect

    async def handshake() -> None:
        comm = await connect(address, timeout=timeout_s)
        await comm.close()

    try:
        asyncio.run(handshake())
    except ValueError as exc:  # distributed cannot parse the address
        fail(f"MALLEABLE_SCHEDULER_ADDRESS={address!r}: {exc}")
    except Exception as exc:  # OSError, a timeout, garbage instead of a handshake
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        fail(f"MALLEABLE_SCHEDULER_ADDRESS={address!r}: no Dask scheduler answers there ({why}); start one or unset MALLEABLE_CLUSTER", code=EXIT_FAILED)


def ui_commands(settings: Settings) -> list[tuple[str, str]]:
    """(what, command) pairs to look at results in the MLflow and Prefect UIs: the configured
    tracking server and Prefect API (``PREFECT_API_URL``, from the environment or the active Prefect
    profile), else the commands that start local ones. A URL's password is never printed."""
    from prefect.settings import get_current_settings  # Prefect's own resolution: env, .env, profile

    from service.redaction import has_secret, redact_url

    uri = settings.resolved_tracking_uri
    shown = '"$MALLEABLE_TRACKING_URI"' if has_secret(uri) else uri
    if uri.startswith("http"):
        mlflow = f"open {redact_url(uri)}"
    else:
        mlflow = f"mlflow ui --backend-store-uri {shown} --port 5000   # then open http://127.0.0.1:5000"
    prefect = get_current_settings()
    if prefect.api.url:
        ui_url = prefect.ui_url or prefect.api.url.removesuffix("/api")
        prefect_line = f"open {redact_url(ui_url)}   # the Prefect server of PREFECT_API_URL"
    else:
        prefect_line = (
            "prefect server start   # then open http://127.0.0.1:4200 (runs made with an ephemeral API are kept in $PREFECT_HOME, "
            "default ~/.prefect; `run --simulate` records one only with PREFECT_API_URL set or MALLEABLE_PREFECT_RUNS=always)"
        )
    return [("MLflow", mlflow), ("Prefect", prefect_line)]


def print_ui_hint() -> None:
    console.print("\n[bold]Look at it:[/]")
    for what, command in ui_commands(settings_or_fail()):
        console.print(f"  {what}: {command}", soft_wrap=True, highlight=False, markup=False)


def store_or_fail(settings: Settings, *, create: bool = True):
    """The job store of ``settings``; a bad URL (or ``:memory:``) exits 2 naming it, an
    unreachable store 1. With ``create=False`` a missing store raises StoreMissingError
    (read-only commands never create one) and nothing is written."""
    from service.store import JobStore, StoreError, StoreMissingError, StorePermissionError, StoreSettingError, in_memory, redact

    url = settings.resolved_job_store
    if in_memory(url):
        fail(f"MALLEABLE_JOB_STORE={redact(url)!r}: an in-memory store ends with this command and its jobs with it; give a file (sqlite:///path/jobs.db) or a server")
    try:
        return JobStore(url, create=create)
    except StoreMissingError:
        raise  # the read-only caller says what a missing store means for it
    except (StoreSettingError, StorePermissionError) as exc:
        fail(f"MALLEABLE_JOB_STORE: {exc}")
    except StoreError as exc:
        fail(str(exc), code=EXIT_FAILED)


def unconfigured_store_line(settings: Settings) -> str | None:
    """Why a client command (submit, jobs, cancel, wait) has no store to use, or None.

    Without ``MALLEABLE_JOB_STORE`` the only store a client may use is the default one a local
    ``malleable serve`` made (``<state dir>/jobs.db``, there already): a client never creates a
    private store that no service reads (issue 35.4)."""
    if settings.job_store or Path(settings.resolved_job_store.removeprefix("sqlite:///")).is_file():
        return None
    return (
        "MALLEABLE_JOB_STORE is not set and no service has made a store here: set it to the store the service serves "
        "(e.g. export MALLEABLE_JOB_STORE=postgresql+psycopg://user@host/db, or sqlite:///path/jobs.db for a local `malleable serve`)"
    )


def configured_store_or_fail(settings: Settings):
    """``store_or_fail`` for a client command: exit 2 with one line naming how to set the store when none is configured."""
    line = unconfigured_store_line(settings)
    if line is not None:
        fail(line)
    return store_or_fail(settings)
