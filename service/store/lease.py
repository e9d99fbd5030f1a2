"""One service schedules a store at a time: a lease row in the store, renewed while it runs.

A second service finds the lease held and refuses. A holder that died stops renewing: its
lease expires after ``ttl_s``, or at once when it ran on this host and its process is gone
(a ``kill -9`` on one machine need not wait out the TTL).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import select, update

from service.store import schema
from service.store.records import LeaseInfo
from service.store import JobStore


class LeaseHeldError(RuntimeError):
    """Another service holds the store's lease."""


def _alive_here(info: LeaseInfo) -> bool:
    """Is the holder's process alive? Only decidable for a holder on this host."""
    if info.host != socket.gethostname() or info.pid is None:
        return True
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True, slots=True)
class Taken:
    """The lease was taken; ``previous`` is who held it before, if that holder did not release it
    (it crashed: its jobs and cluster need fencing)."""

    holder: str
    previous: LeaseInfo | None


class Lease:
    def __init__(self, store: JobStore, ttl_s: float = 10.0) -> None:
        if not (ttl_s > 0):
            raise ValueError(f"ttl_s={ttl_s!r}: must be > 0")
        self.store, self.ttl_s = store, ttl_s
        self.holder = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = threading.Event()

    def info(self) -> LeaseInfo:
        with self.store.engine.connect() as conn:
            r = conn.execute(select(schema.lease).where(schema.lease.c.name == "scheduler")).one()
        return LeaseInfo(r.holder, r.host, r.pid, r.expires_at, r.cluster_address, r.cluster_owned)

    def acquire(self) -> Taken:
        info = self.info()
        now = time.time()
        if info.holder is not None and info.expires_at > now and _alive_here(info):
            raise LeaseHeldError(
                f"another malleable service (pid {info.pid} on {info.host}) schedules this job store; "
                f"its lease runs until {time.strftime('%H:%M:%S', time.localtime(info.expires_at))} — stop it first, or use another MALLEABLE_JOB_STORE"
            )
        c = schema.lease.c
        # Compare-and-swap on the holder we saw: of two services starting together, one wins.
        cas = c.holder.is_(None) if info.holder is None else c.holder == info.holder
        with self.store.engine.begin() as conn:
            won = conn.execute(
                update(schema.lease)
                .where(c.name == "scheduler", cas)
                .values(holder=self.holder, host=socket.gethostname(), pid=os.getpid(), expires_at=now + self.ttl_s, cluster_address=None, cluster_owned=False)
            ).rowcount
        if won != 1:
            raise LeaseHeldError("another malleable service took this job store's lease at the same moment; stop it first")
        return Taken(self.holder, info if info.holder is not None else None)

    def note_cluster(self, address: str, owned: bool) -> None:
        """Record the Dask scheduler this holder drives, so a successor can fence it after a crash."""
        with self.store.engine.begin() as conn:
            conn.execute(update(schema.lease).where(schema.lease.c.holder == self.holder).values(cluster_address=address, cluster_owned=owned))

    def renew(self) -> bool:
        with self.store.engine.begin() as conn:
            ok = conn.execute(
                update(schema.lease).where(schema.lease.c.holder == self.holder).values(expires_at=time.time() + self.ttl_s)
            ).rowcount == 1
        if not ok:
            self.lost.set()
        return ok

    def keep_renewed(self) -> None:
        """Renew every third of the TTL in a thread of its own (the loop may block in a rescale)."""

        def run() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                try:
                    if not self.renew():
                        return
                except Exception:  # noqa: BLE001 - a store hiccup; the next renewal retries
                    continue

        self._thread = threading.Thread(target=run, daemon=True, name="malleable-lease")
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self.store.engine.begin() as conn:
            conn.execute(
                update(schema.lease).where(schema.lease.c.holder == self.holder).values(holder=None, expires_at=0.0, cluster_address=None, cluster_owned=False)
            )
