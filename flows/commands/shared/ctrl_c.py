"""Ctrl-C as a request to stop a refresh loop, not an exception thrown into whatever runs.

A KeyboardInterrupt raised at an arbitrary bytecode lands wherever the loop happens to be: inside
SQLAlchemy returning a connection to its pool (it then prints a traceback), inside rich's
rendering, or in a write to a pipe. The loop instead asks ``stopped`` between its steps and sleeps
in short slices, so it ends within a slice of the signal. A second Ctrl-C raises at once, for a
step that does not return.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from types import FrameType

SLICE_S = 0.05


@dataclass
class CtrlC:
    """While entered: SIGINT sets ``stopped``; the previous handler is back on exit."""

    stopped: bool = False
    _previous: object = field(default=None, repr=False)

    def __enter__(self) -> CtrlC:
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.stopped:
            raise KeyboardInterrupt
        self.stopped = True

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, returning within one slice of a Ctrl-C."""
        end = time.monotonic() + seconds
        while not self.stopped and (left := end - time.monotonic()) > 0:
            time.sleep(min(SLICE_S, left))
