"""The rank's courier thread: learns of new plan versions while the rank trains, pushes status.

Split out of ``trainer.py`` (``trainer._Courier`` still names it). With a ``HostShare`` the
courier of one rank per host leads it and watches: it leaves each new plan in the host's shared
memory as soon as it learns of it, before it passes the version on to the agreement, for every
rank of the host to find at the boundary where the plan becomes due (``host_share.py``); the
stride watchers wait for that (a second at most) before they pass it on.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from elastic_tasks.board import Fenced, JobBoard, JobStatus
from elastic_tasks.rank.host_share import HostShare

_WAIT_S = 2.0  # courier: longest server-side wait for the next plan version
_BACKUP_POLL_S = 2.0
_STATUS_EVERY_S = 0.5
_SHARE_GRACE_S = 1.0  # a watcher waits this long at most for its host's leader to share a plan
_IDLE_S = 5.0  # an idle courier (no watching, no status) tries to lead its host this often
# One rank in this many watches the board (control plane at scale, docs/elastic.md): the end-of-step
# agreement already spreads the newest version any rank has seen to all of them within a step, so
# N long-polls on the scheduler buy nothing over N / WATCH_STRIDE (1,024 ranks: 16, not 1,024).
WATCH_STRIDE = 64


def watches(rank: int) -> bool:
    """Whether rank ``rank`` of a generation long-polls the board for new plan versions (rank 0 always)."""
    return rank % WATCH_STRIDE == 0


class Courier(threading.Thread):
    """Learns of new plan versions while the rank trains; pushes rank 0's status now and then.

    It long-polls the Dask ``Event`` of the next plan version (the scheduler answers the
    moment the plan is published, or after ``_WAIT_S``), so a training process pays about one
    idle request per ``_WAIT_S`` rather than a busy poll; a slow read of the latest version
    backs it up should a version ever be skipped.
    """

    def __init__(self, board: JobBoard, share: HostShare | None = None) -> None:
        super().__init__(daemon=True, name="malleable-courier")
        self.board = board
        self.share = share
        self._next_lead_try = 0.0
        self._shared = -1  # the newest version this courier left in the host's share
        self.seen_version = -1
        self._status: JobStatus | None = None
        self._draft: Callable[[], JobStatus] | None = None  # ``offer``'s, built only when read
        self._built: tuple[Callable[[], JobStatus], JobStatus] | None = None  # (draft, its status)
        self._sent: JobStatus | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()  # a status to push, or stop: an idle courier sleeps until then
        self._seen_lock = threading.Lock()  # the courier and the rank's refresh() both raise it
        # False: the rank learns new versions from the agreement only (``watches``); status is still pushed.
        self.watching = True
        self.fenced = False  # the board refused a status: this rank was declared lost

    def _see(self, version: int | None) -> None:
        with self._seen_lock:
            if version is not None and version > self.seen_version:
                self.seen_version = int(version)

    @property
    def status(self) -> JobStatus | None:
        """The newest status: the one set, or the one ``offer`` made possible (built once, then kept)."""
        draft = self._draft
        if draft is not None:
            built = self._built
            if built is None or built[0] is not draft:
                built = self._built = (draft, draft())  # either thread may build it: the same value
            return built[1]
        return self._status

    @status.setter
    def status(self, status: JobStatus | None) -> None:
        self._status, self._draft = status, None
        self._wake.set()

    def offer(self, draft: Callable[[], JobStatus]) -> None:
        """The newest status, as a function that builds it: rank 0 offers one every step, and a
        status is pushed at most every ``_STATUS_EVERY_S``, so only the ones pushed are built
        (a ``JobStatus`` and a wake-up per step were ~10 µs of the step's host time, issue 34).
        An idle courier is woken once per push, not once per step."""
        self._draft = draft
        if not self._wake.is_set():
            self._wake.set()

    def _idle(self, last_push: float) -> float:
        """No watching to do: sleep until a status is due (at most one per ``_STATUS_EVERY_S``) or a
        lead is worth trying again; push it. Where ranks are many, few wake-ups: (1,024 ranks'
        couriers, every 2 s, were a tenth of a bench host's GIL hand-offs). Returns the last push."""
        if self.status is None or self.status is self._sent:
            self._wake.wait(_IDLE_S)
            self._wake.clear()
        if self.status is not None and self.status is not self._sent:
            self._stopping.wait(max(0.0, last_push + _STATUS_EVERY_S - time.monotonic()))
            self.flush()
            return time.monotonic()
        return last_push

    def _leads(self) -> bool:
        """Whether this courier leads its host's share (trying to, now and then, while another does)."""
        share = self.share
        if share is None:
            return False
        if not share.leading and time.monotonic() >= self._next_lead_try:
            self._next_lead_try = time.monotonic() + _WAIT_S
            share.lead()
        return share.leading

    def _active(self) -> bool:
        """Whether this courier asks the board for new versions: a watcher (``watches``) or its host's leader."""
        return self._leads() or self.watching

    def _learn(self, version: int | None) -> None:
        """Version ``version`` is published: its plan into the host's share first, then into the
        agreement (``seen_version``) — so by the boundary where it is due, the hosts have it. A
        watcher that does not lead waits for its host's leader to share it, ``_SHARE_GRACE_S`` at
        most: a leader hung with its lock held must not keep the job from learning of plans."""
        share = self.share
        if version is None or version <= self.seen_version:
            return
        if share is not None and share.leading and version > self._shared:
            with contextlib.suppress(Exception):  # the host's ranks read the store or the board instead
                share.put(version, self.board.plan_bytes(version, timeout=_WAIT_S))
                self._shared = version
        elif share is not None and share.usable():
            deadline = time.monotonic() + _SHARE_GRACE_S
            while share.get(version) is None and time.monotonic() < deadline and not self._stopping.wait(0.01):
                pass
        self._see(version)

    def run(self) -> None:
        try:
            self._run()
        finally:
            if self.share is not None:
                self.share.resign()

    def _run(self) -> None:
        last_poll = last_push = 0.0
        while not self._stopping.is_set():
            if not self._active():  # no request to the scheduler; status is rank 0's, a watcher's
                last_push = self._idle(last_push)
                continue
            try:
                # The version waited for, fixed before the wait: the rank's own refresh() may
                # raise seen_version meanwhile, and re-reading it here would claim a version
                # nobody has published yet (ranks then wait for it and fail the generation).
                target = self.seen_version + 1
                if self.board.wait_published(target, timeout=_WAIT_S):
                    self._learn(target)
            except Exception:  # noqa: BLE001 - the worker is closing; the stop flag ends us
                self._stopping.wait(_WAIT_S)
            now = time.monotonic()
            if now - last_poll >= _BACKUP_POLL_S:
                with contextlib.suppress(Exception):
                    self._learn(self.board.latest_version())
                last_poll = now
            status = self.status
            if status is not None and status is not self._sent and now - last_push >= _STATUS_EVERY_S:
                self._push(status)
                last_push = now

    def refresh(self) -> int:
        """Read the newest version now (recovery: no waiting for the backup poll)."""
        with contextlib.suppress(Exception):
            self._see(self.board.latest_version())
        return self.seen_version

    def flush(self) -> None:
        status = self.status
        if status is not None and status is not self._sent:
            self._push(status)

    def _push(self, status: JobStatus) -> None:
        try:
            self.board.set_status(status)
            self._sent = status
        except Fenced:
            # The scheduler refuses this rank's writes for good: stop asking (the rank's own
            # next write raises Fenced in its thread and it leaves).
            self.fenced = True
            self._stopping.set()
        except Exception:  # noqa: BLE001 - the worker is closing; the stop flag ends us
            pass

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
