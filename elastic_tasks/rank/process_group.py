"""One torch process group per generation, formed over a fresh ``TCPStore`` on rank 0's host.

The store is the control plane (short ``timeout_s``); the group's collectives are the data plane
(``data_timeout_s``). Rank 0 publishes the store's address on the job board; the others read it
there. A generation's group is destroyed before the next one forms — or, if the hang watch
aborted it, left alone: the next generation's group forms on a fresh store, beside nothing.

``init_process_group`` takes one timeout for both its own connect and every later collective:
gloo's full-mesh connect waited the data timeout (600 s) for a rank that never came
(docs/benchmarks.md, the 15:36 run). So every rank first checks in on the store
(``arrival_barrier``), a control-plane wait (``timeout_s``; the plan wait where ranks may still
be starting); the group forms only once all have, and a missing rank fails the generation's
rendezvous, naming it, which sends its peers into recovery as a lost peer does. A rank that
dies between the barrier and the connect is the same case one step later: the group is formed
with the control timeout (all ranks have checked in, so the connect is quick), and only then
given the data timeout for its collectives.
"""

from __future__ import annotations

import contextlib
import os
import time
from datetime import timedelta

import torch.distributed as dist

from elastic_tasks.board import JobBoard
from elastic_tasks.devices import own_socket_env, process_group_backend
from elastic_tasks.protocol import TrainConfig
from elastic_tasks.rank.health.hang_watch import abort_communicators, configure_nccl_error_mode

# Fault injection (tests): "VERSION:RANK:SECONDS" makes that rank of that generation sleep
# before it checks in, as a rank held elsewhere would (its worker busy, its host overloaded).
LATE_RANK_ENV = "MALLEABLE_SIMULATE_LATE_RANK"
# The same, after the rank checked in and before it connects (a rank lost between the two).
LATE_CONNECT_ENV = "MALLEABLE_SIMULATE_LATE_CONNECT"
# Store keys of the arrival barrier (the store is the generation's own: no version in them).
_ARRIVED = "malleable/arrived"
_OUTCOME = "malleable/rendezvous"
_COMPLETE, _ABANDONED = b"complete", b"abandoned"


class ProcessGroups:
    """Forms and drops this rank's process group, one generation at a time."""

    def __init__(self, board: JobBoard, host: str, backend: str, config: TrainConfig) -> None:
        self.board = board
        self.host = host
        self.backend = backend
        self.config = config
        self._stores: list[dist.TCPStore] = []

    def form(self, version: int, rank: int, world: int, opens_within_s: float | None = None, arrive_within_s: float | None = None) -> None:
        """Join generation ``version``'s group as ``rank`` of ``world``.

        ``opens_within_s``: how long a rank other than 0 waits for rank 0 to open the rendezvous;
        ``arrive_within_s``: how long every rank waits for all to check in (None: ``timeout_s``;
        longer where ranks may be starting, coordinator/timeouts.rendezvous_wait_s).
        """
        timeout = timedelta(seconds=self.config.timeout_s)
        configure_nccl_error_mode(self.backend)
        # Multi-host: gloo/nccl connect on the interface of the worker's own address unless the user chose one.
        os.environ.update(own_socket_env(self.host, os.environ))
        if rank == 0:
            store = dist.TCPStore(self.host, 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
            self.board.set_rendezvous(version, self.host, store.port)
        else:
            host, port = self.board.rendezvous(version, timeout=opens_within_s or self.config.timeout_s)
            store = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
        # Keep the previous generation's store alive a little longer: a slow peer may still close on it.
        self._stores = [*self._stores[-1:], store]
        _simulate_late_rank(LATE_RANK_ENV, version, rank)
        arrival_barrier(store, version, rank, world, arrive_within_s or self.config.timeout_s)
        _simulate_late_rank(LATE_CONNECT_ENV, version, rank)
        dist.init_process_group(process_group_backend(self.backend), store=store, rank=rank, world_size=world, timeout=timeout)
        # torch's only way to give a formed group another timeout (private, present since 2.3).
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=self.config.data_timeout_s))

    @property
    def store(self) -> dist.TCPStore | None:
        """The current generation's store (None before the first)."""
        return self._stores[-1] if self._stores else None

    @staticmethod
    def drop(aborted: bool = False) -> None:
        """Leave the current group, if any (a failed peer may make this raise: it is gone either way).

        A group the hang watch ``aborted`` is never destroyed: destroy shuts the communicators
        down through the peers it would wait for. The abort unregistered it already; should
        any of it be left, it is aborted again, locally."""
        if not dist.is_initialized():
            return
        if aborted:
            abort_communicators()
            return
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def arrival_barrier(store: dist.Store, version: int, rank: int, world: int, timeout_s: float) -> None:
    """Return once all ``world`` ranks checked in on ``store``; ``TimeoutError`` naming the missing
    ranks if they did not within ``timeout_s``.

    The outcome is decided once, by an atomic compare-and-set: the last rank to arrive marks the
    rendezvous complete, the first to give up marks it abandoned, whichever comes first. So a
    rank that arrives after its peers gave up fails too, instead of waiting in the group's
    connect for peers that left (the data timeout again).
    """
    store.set(f"{_ARRIVED}/{rank}", "1")
    if store.add(_ARRIVED, 1) == world:
        outcome = store.compare_set(_OUTCOME, "", _COMPLETE.decode())
    else:
        try:
            store.wait([_OUTCOME], timedelta(seconds=timeout_s))
            outcome = store.get(_OUTCOME)
        except dist.DistStoreError:  # timed out: give up, unless the last rank arrived meanwhile
            outcome = store.compare_set(_OUTCOME, "", _ABANDONED.decode())
    if outcome == _COMPLETE:
        return
    missing = [r for r in range(world) if not store.check([f"{_ARRIVED}/{r}"])]
    if missing:
        raise TimeoutError(f"rank(s) {missing} of generation {version} did not reach its rendezvous within {timeout_s:g} s")
    raise TimeoutError(f"rank {rank} reached generation {version}'s rendezvous after its peers gave up on it ({timeout_s:g} s)")


def _simulate_late_rank(env: str, version: int, rank: int) -> None:
    value = os.environ.get(env, "")
    if not value:
        return
    try:
        late_version, late_rank, seconds = value.split(":")
        target = (int(late_version), int(late_rank))
        delay = float(seconds)
    except ValueError:
        raise ValueError(f"{env}={value!r}: expected VERSION:RANK:SECONDS") from None
    if target == (version, rank):
        time.sleep(delay)
