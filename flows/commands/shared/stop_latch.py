"""SIGTERM / SIGINT for ``malleable serve``: handlers that cannot deadlock.

A Python signal handler runs on the main thread between two bytecodes, possibly inside a
lock the main thread holds (``threading.Event.set`` holds its Condition's lock): a handler
that takes a lock itself can wait for ever on its own thread (issue 28: two SIGTERMs hung
``serve`` for good). So the handler only counts the signal and writes one byte to a pipe.
A watcher thread reads the pipe and decides:

* the first signal: ``on_stop`` (the service stops; its main thread checkpoints and
  suspends the running jobs, writes the store, releases the lease, shuts the cluster down);
* a second SIGTERM while stopping: logged and ignored (a process manager that signals twice);
* a third SIGTERM, or a second SIGINT (Ctrl-C twice): ``on_fast_stop`` within a deadline
  (the store's running jobs suspended, to resume from their last checkpoint; the lease
  released), then the process ends with 130.

Stdlib only, and armed by ``flows.commands.cli`` before it imports anything heavy, so a
SIGTERM is handled from the first instant of the process (it was exit 143 and no word for
the first ~1.5 s).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

# A Ctrl-C twice or SIGTERM three times: the operator wants it gone now.
FAST_STOP_AFTER = {signal.SIGINT: 2, signal.SIGTERM: 3}
FAST_STOP_DEADLINE_S = 8.0
EXIT_FAST_STOP = 130


class StopLatch:
    """Counts SIGTERM/SIGINT in a handler that takes no lock; a thread acts on them."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self.counts = {signal.SIGTERM: 0, signal.SIGINT: 0}
        self.stopping = threading.Event()  # set by the watcher thread, never by the handler
        self.say: Callable[[str], None] = lambda line: (sys.stderr.write(line + "\n"), sys.stderr.flush())
        self.on_stop: Callable[[], None] = lambda: None
        self.on_fast_stop: Callable[[], None] = lambda: None
        self._watcher: threading.Thread | None = None

    def handle(self, signum: int, _frame: object) -> None:
        # Only an int store and a non-blocking write: nothing here can wait on a lock.
        self.counts[signum] = self.counts.get(signum, 0) + 1
        try:
            os.write(self._write_fd, bytes([signum]))
        except (BlockingIOError, OSError):
            pass  # the pipe is full of earlier signals: the count still holds this one

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)

    def settle(self) -> None:
        """The stop is done: from here a late SIGTERM is ignored.

        The interpreter's finalisation puts back the default action for every signal that has a
        Python handler, so a process manager's second SIGTERM landing after a quick clean stop
        killed the process with 143 instead of letting it exit 0 (CI saw it). SIG_IGN survives
        finalisation; SIGINT keeps its handler, so Ctrl-C still ends a hung exit."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def watch(self, say: Callable[[str], None], on_stop: Callable[[], None], on_fast_stop: Callable[[], None]) -> None:
        """Start acting on signals (also on those that came before this call)."""
        self.say, self.on_stop, self.on_fast_stop = say, on_stop, on_fast_stop
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._run, daemon=True, name="malleable-signals")
            self._watcher.start()

    def _run(self) -> None:
        seen = 0
        while True:
            try:
                got = os.read(self._read_fd, 64)
            except InterruptedError:
                continue
            for signum in got:
                seen += 1
                self._act(signal.Signals(signum), first=seen == 1)

    def _act(self, sig: signal.Signals, first: bool) -> None:
        if first:
            self.say(f"{sig.name}: stopping (running jobs checkpoint first; Ctrl-C twice or SIGTERM three times stops at once)")
            self.stopping.set()
            self.on_stop()
            return
        if self.counts.get(sig, 0) >= FAST_STOP_AFTER.get(sig, 2):
            self.say(f"{sig.name} again: stopping at once (running jobs resume from their last checkpoint)")
            worker = threading.Thread(target=self._fast_stop, daemon=True, name="malleable-fast-stop")
            worker.start()
            worker.join(FAST_STOP_DEADLINE_S)
            self.say("stopped at once")
            os._exit(EXIT_FAST_STOP)
        self.say(f"{sig.name} again: already stopping, ignored (send it {FAST_STOP_AFTER.get(sig, 2) - self.counts.get(sig, 0)} more time(s) to stop at once)")

    def _fast_stop(self) -> None:
        try:
            self.on_fast_stop()
        except Exception as exc:  # noqa: BLE001 - the process ends either way; say why it was not clean
            self.say(f"fast stop: {type(exc).__name__}: {exc}")


_ARMED: list[StopLatch] = []  # signals are process-wide: at most one latch per process


def arm(argv: list[str]) -> None:
    """In ``malleable serve``: handle SIGTERM/SIGINT from now on (before the heavy imports)."""
    command = next((a for a in argv[1:] if not a.startswith("-")), None)  # the root options take no values
    if command == "serve" and not _ARMED and threading.current_thread() is threading.main_thread():
        latch = StopLatch()
        latch.install()
        _ARMED.append(latch)


def armed() -> StopLatch:
    """The process's latch (armed now if the CLI did not, e.g. under a test runner)."""
    if not _ARMED:
        latch = StopLatch()
        if threading.current_thread() is threading.main_thread():
            latch.install()
        _ARMED.append(latch)
    return _ARMED[0]
