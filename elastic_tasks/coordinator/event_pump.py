"""A job coordinator's ears: a thread drains the ranks' events from the job board and keeps what it heard.

Waiters block on the pump's condition until a predicate over what was heard holds. After
each drain the pump calls ``on_tick`` (recovery looks for failed generations there), so
everything that reacts to events runs on this one thread, in the order events arrived.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from elastic_tasks.board import EventKind, JobBoard, RankEvent

# An empty drain waits this long and looks once more: the latency of hearing an event. Pauses
# are timed by the ranks themselves, so this costs the coordinator's reaction time only.
DRAIN_S = 0.1
# A blocked waiter wakes at least this often: its predicate may depend on things the pump does
# not announce (a worker's death, a deadline).
WAIT_SLICE_S = 0.2
# The board's client failed (it is closing): look again this much later, unless closed.
RETRY_S = 0.2
# ``close`` waits this long for the thread: one drain plus one tick normally take well under.
JOIN_S = 5.0


@dataclass
class Heard:
    """What the pump has heard (guarded by its condition)."""

    ready: set[str] = field(default_factory=set)
    applied: dict[int, RankEvent] = field(default_factory=dict)
    stopped: dict[int, RankEvent] = field(default_factory=dict)
    failed: dict[int, dict[str, int]] = field(default_factory=dict)  # version -> uid -> step it held
    blocked: dict[int, float] = field(default_factory=dict)  # version -> longest a reporter sat in its failed collective
    stragglers: list[tuple[int, str]] = field(default_factory=list)
    errors: list[RankEvent] = field(default_factory=list)
    finished: RankEvent | None = None


class EventPump:
    def __init__(self, board: JobBoard, name: str, on_event: Callable[[RankEvent], None], on_tick: Callable[[], None]) -> None:
        self.board = board
        self.name = name
        self.heard = Heard()
        self.cond = threading.Condition()
        self._on_event = on_event
        self._on_tick = on_tick
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True, name=f"malleable-monitor-{self.name}")
            self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=JOIN_S)

    def pump(self) -> None:
        """Drain and record once, on the caller's thread (recovery waits on the pump's own thread)."""
        for event in self.board.drain(timeout=DRAIN_S):
            self.record(event)

    def record(self, event: RankEvent) -> None:
        with self.cond:
            h = self.heard
            if event.kind == EventKind.READY:
                h.ready.add(event.uid)
            elif event.kind == EventKind.APPLIED:
                h.applied[event.version] = event
            elif event.kind == EventKind.STOPPED:
                h.stopped[event.version] = event
            elif event.kind == EventKind.FAILED:
                h.failed.setdefault(event.version, {})[event.uid] = event.step
                h.blocked[event.version] = max(h.blocked.get(event.version, 0.0), event.blocked_s)
            elif event.kind == EventKind.STRAGGLER:
                h.stragglers.append((event.step, event.uid))
            elif event.kind == EventKind.FINISHED:
                h.finished = event
            elif event.kind == EventKind.ERROR:
                h.errors.append(event)
            self.cond.notify_all()
        self._on_event(event)

    def mark_failed(self, version: int) -> None:
        """Generation ``version`` failed with nobody left to say so (every rank died at once)."""
        with self.cond:
            self.heard.failed.setdefault(version, {})

    def wait_for(self, predicate: Callable[[Heard], object], timeout: float) -> object | None:
        """The predicate's first truthy value; None on timeout or once an error was heard."""
        self.start()
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate(self.heard)
                if value:
                    return value
                left = deadline - time.monotonic()
                if self.heard.errors or left <= 0:
                    return None
                self.cond.wait(min(left, WAIT_SLICE_S))

    def nap(self) -> None:
        """Sleep until something is heard (or a wait slice passes)."""
        with self.cond:
            self.cond.wait(WAIT_SLICE_S)

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                events = self.board.drain(timeout=DRAIN_S)
            except Exception:  # noqa: BLE001 - the client is closing; nothing left to watch
                if self._closed.wait(RETRY_S):
                    return
                continue
            for event in events:
                self.record(event)
            self._on_tick()
