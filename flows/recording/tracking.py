"""MLflow for the flows and the CLI: the service's buffering tracker (``service.tracking.buffered``:
calls journaled while the store is away, replayed in order when it answers) with the CLI's
defaults — notes on the console, the local sqlite store checked for damage before it is opened,
settings read from ``flows.config.settings``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from flows.config.local_state import DamagedStateError, check_sqlite
from service.tracking.buffered import OFFLINE_PREFIX, PARENT_TAG, BufferedTracker, MetricPoint
from service.tracking.failures import StoreDamagedError
from service.tracking.failures import store_damaged as _store_damaged
from service.tracking.failures import store_unavailable, unreachable

__all__ = ["OFFLINE_PREFIX", "PARENT_TAG", "MetricPoint", "Tracker", "journaled", "store_damaged", "tracker_from_settings", "unavailable"]


def store_damaged(exc: BaseException) -> bool:
    """Is a local store broken (a truncated or corrupt sqlite file) rather than the request bad?"""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DamagedStateError):
            return True
        seen = seen.__cause__ or seen.__context__
    return _store_damaged(exc)


def unavailable(exc: BaseException) -> bool:
    """The store cannot be used now: the server is unreachable or the local store is damaged."""
    return unreachable(exc) or store_damaged(exc)


def journaled(exc: BaseException) -> bool:
    """Which failures the flows' tracker journals and replays: the service's reading
    (``store_unavailable``: any failure of the store rather than of the request), so flows and
    service keep one policy; plus a local store this package found damaged."""
    return store_unavailable(exc) or store_damaged(exc)


def _say(message: str) -> None:
    from flows.commands.shared.console import err_console

    err_console.print(f"[yellow]{message}[/]", highlight=False, soft_wrap=True)


def _check_local_store(uri: str) -> None:
    """SQLite may not notice a truncated file until too late: its header is checked first."""
    if not uri.startswith("sqlite:///"):
        return
    try:
        check_sqlite(Path(uri.removeprefix("sqlite:///")), "MLflow store", "the next command starts a fresh one")
    except DamagedStateError as exc:
        raise StoreDamagedError(str(exc)) from exc


class Tracker(BufferedTracker):
    """``BufferedTracker`` as the flows use it: a call MLflow refuses raises in the flow."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        buffer_path: Path | str,
        *,
        timeout_s: float = 5.0,
        retry_every_s: float = 10.0,
        notify: Callable[[str], None] = _say,
        artifact_location: str | None = None,
    ) -> None:
        super().__init__(
            tracking_uri, experiment, buffer_path, timeout_s=timeout_s, retry_every_s=retry_every_s, notify=notify,
            artifact_location=artifact_location, check_store=_check_local_store, unavailable=journaled,
        )  # fmt: skip


def tracker_from_settings(settings: object, **kwargs: object) -> Tracker:
    """A Tracker configured from ``flows.config.settings.Settings``."""
    from flows.config.settings import Settings

    assert isinstance(settings, Settings)
    from service.tracking.experiment import artifact_root

    # Artifacts beside a sqlite store (or in the state directory), never in ./mlruns of wherever
    # the command ran; a tracking server chooses its own.
    artifacts = artifact_root(settings.resolved_tracking_uri, settings.state_dir)
    return Tracker(
        settings.resolved_tracking_uri,
        settings.experiment,
        settings.buffer_path,
        timeout_s=settings.tracking_timeout_s,
        artifact_location=artifacts,
        **kwargs,  # type: ignore[arg-type]
    )
