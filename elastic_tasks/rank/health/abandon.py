"""Data-plane waits the control plane can abandon, on gloo as on nccl.

gloo cannot abort a collective in flight. Measured with torch 2.13 (two gloo processes, the
peer never joins the allreduce): ``ProcessGroupGloo.abort()``, ``.shutdown()`` and
``distributed_c10d._abort_process_group()`` all return at once, and the allreduce is still
blocked 13 s later; gloo raises only at its own timeout (``data_timeout_s``, 600 s). A
survivor of a silently partitioned or frozen peer (a host that answers nothing: no socket is
ever closed) would sit in the collective for the whole data timeout.

So no data-plane wait of the rank blocks inside gloo. Each waits on a ``torch.futures.Future``
(a *proxy*) that completes with the collective's own future — or fails with
``CollectiveFailure`` the moment the ``HangWatch`` gives up on the generation
(``DataPlaneWaits.abandon``): the agreement's read, the state broadcast's chunks, and DDP's
gradient allreduce, whose communication hook returns the proxy (``gradient_hook.py``; DDP's
reducer waits on the hook's future, so failing it unblocks ``backward()``).

The stuck collective keeps its gloo thread. The process group object is kept referenced in
``zombies`` (dropping its last reference would join that thread: a wait for ever), so
``destroy_process_group`` returns at once and the next generation forms over its own
``TCPStore``; a zombie is let go once every collective it had in flight has ended (the
peer's socket closed, or gloo's own timeout).

On nccl the CUDA collectives are freed by the communicator abort (``hang_watch.py``); their
futures complete at enqueue (CUDA futures), so they are waited on as they are. The CPU
collectives of an nccl job (its gloo side: the agreement, Adam's ``step``) go through proxies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from elastic_tasks.rank.health.collective import CollectiveFailure

_OnError = Callable[[BaseException], None] | None


@dataclass(frozen=True, slots=True)
class _Zombie:
    """An abandoned generation's group, held until its collectives end."""

    generation: int
    group: object  # the ProcessGroup (None if none was formed)
    stuck: tuple[torch.futures.Future, ...]

    def ended(self) -> bool:
        return all(f.done() for f in self.stuck)


class DataPlaneWaits:
    """The rank's data-plane waits in flight, which ``abandon`` fails all at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # id(proxy) -> (proxy, source, first, on_error): a tuple, made for every bucket of every step
        self._open: dict[int, tuple[torch.futures.Future, torch.futures.Future, bool, _OnError]] = {}
        self._abandoned: tuple[int, str] | None = None  # (generation, why)
        self.zombies: list[_Zombie] = []

    def enter(self, generation: int) -> None:
        """A data-plane region of ``generation`` begins: past an abandoned generation, waits are waited again."""
        if self._abandoned is not None and generation > self._abandoned[0]:
            with self._lock:
                self._abandoned = None
        if self.zombies:
            self.zombies = [z for z in self.zombies if not z.ended()]

    def guard(self, source: torch.futures.Future, first: bool = False, on_error: _OnError = None) -> torch.futures.Future:
        """A future that completes as ``source`` does, or fails with ``CollectiveFailure`` when abandoned.

        ``first``: its value is the first tensor of ``source``'s list (a collective's output, as
        a DDP hook returns it) — no ``then`` callback, whose failures torch re-wraps in text.
        ``on_error`` is told the exception the proxy fails with (before its waiter sees it): the
        DDP hook's witness, without a second future and callback per bucket.
        """
        proxy: torch.futures.Future = torch.futures.Future()
        key = id(proxy)
        with self._lock:
            abandoned = self._abandoned
            if abandoned is None:
                self._open[key] = (proxy, source, first, on_error)
        if abandoned is not None:
            _fail(proxy, _failure(abandoned), on_error)
            return proxy
        source.add_done_callback(lambda done: self._settle(key, done))
        return proxy

    def wait(self, work: dist.Work, on_device: bool = False) -> None:
        """Wait for ``work``; ``on_device``: an nccl collective (waited as is: the abort frees it).

        A collective already complete cannot hold the rank: it is read as is, without a proxy
        (the agreement's, read a step after it was issued, nearly always is; a proxy's callback
        runs on gloo's thread and costs ~30 µs of CPU per wait)."""
        if on_device or (self._abandoned is None and work.is_completed()):
            work.wait()
            return
        self.guard(work.get_future()).wait()

    def abandon(self, generation: int, why: str) -> None:
        """Fail every wait in flight, and every one begun before a newer generation's region."""
        with self._lock:
            self._abandoned = (generation, why)
            entries, self._open = list(self._open.values()), {}
        if entries:
            group = dist.group.WORLD if dist.is_initialized() else None
            self.zombies.append(_Zombie(generation, group, tuple(source for _, source, _, _ in entries)))
        for proxy, _, _, on_error in entries:
            _fail(proxy, _failure((generation, why)), on_error)

    def _settle(self, key: int, source: torch.futures.Future) -> None:
        """On the collective's thread, when it ends: pass its outcome on, unless abandoned meanwhile."""
        with self._lock:
            entry = self._open.pop(key, None)
        if entry is None:
            return
        proxy, _, first, on_error = entry
        try:
            value = source.value()
        except Exception as exc:  # noqa: BLE001 - the collective's own failure, handed to the waiter
            _fail(proxy, exc, on_error)
            return
        proxy.set_result(value[0] if first else value)


def _fail(proxy: torch.futures.Future, exc: BaseException, on_error: _OnError) -> None:
    if on_error is not None:
        on_error(exc)
    proxy.set_exception(exc)


def _failure(abandoned: tuple[int, str]) -> CollectiveFailure:
    return CollectiveFailure(f"data-plane wait of generation {abandoned[0]} abandoned: {abandoned[1]}")
