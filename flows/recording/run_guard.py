"""MLflow runs a command opened are never left RUNNING when it fails or is interrupted.

A flow opens runs through ``RunGuard`` and ends them through it; if the flow raises before
ending one, the guard ends it FAILED (an error) or KILLED (Ctrl-C, SystemExit) and lets the
exception go on. Ending is best effort: a tracking failure while cleaning up never hides
the error that got us there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import TracebackType

from flows.recording.tracking import Tracker

log = logging.getLogger(__name__)


def status_for(exc: BaseException) -> str:
    """MLflow's status for a run cut short by ``exc``."""
    return "FAILED" if isinstance(exc, Exception) else "KILLED"


class RunGuard:
    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self._open: list[str] = []

    def start_run(
        self, name: str, *, parent: str | None = None, params: Mapping[str, object] | None = None, tags: Mapping[str, str] | None = None
    ) -> str:
        run = self.tracker.start_run(name, parent=parent, params=params, tags=tags)
        self._open.append(run)
        return run

    def end_run(self, run: str, status: str = "FINISHED") -> None:
        self.tracker.end_run(run, status)
        self._open.remove(run)

    @property
    def open_runs(self) -> tuple[str, ...]:
        return tuple(self._open)

    def __enter__(self) -> RunGuard:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            return
        status = status_for(exc)
        # What went wrong, on the run itself (issue 35.5): MLflow's limit on a tag's value.
        error = f"{type(exc).__name__}: {exc}"[:5000]
        for run in reversed(self._open):  # children before their parent
            try:
                self.tracker.set_tags(run, {"malleable.error": error})
                self.tracker.end_run(run, status)
            except Exception as cleanup:  # noqa: BLE001 - the original error matters more
                log.warning("could not mark MLflow run %s %s: %s", run, status, cleanup)
        self._open.clear()
