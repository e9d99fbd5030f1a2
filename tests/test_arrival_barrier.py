"""The arrival barrier before a generation's group forms, on a real ``TCPStore`` (threads as ranks).

Every rank checks in; the group may form only once all have. A missing rank fails the barrier
within the given timeout, naming it; a rank that arrives after its peers gave up fails too
(it must not go on to wait in the group's connect for peers that left).
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from elastic_tasks.rank.process_group import arrival_barrier

pytestmark = pytest.mark.timeout(60)

WAIT_S = 1.0


def _stores(world: int) -> list[dist.TCPStore]:
    timeout = timedelta(seconds=10)
    master = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
    return [master] + [dist.TCPStore("127.0.0.1", master.port, world, is_master=False, timeout=timeout) for _ in range(world - 1)]


def _arrive(stores: list[dist.TCPStore], ranks: list[int], world: int) -> dict[int, BaseException | None]:
    """Ranks ``ranks`` check in at once (one thread each); what each got."""
    outcome: dict[int, BaseException | None] = {}

    def run(rank: int) -> None:
        try:
            arrival_barrier(stores[rank], 7, rank, world, WAIT_S)
            outcome[rank] = None
        except BaseException as exc:  # noqa: BLE001 - the test looks at what came out
            outcome[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


def test_every_rank_passes_once_all_arrived():
    stores = _stores(3)
    assert _arrive(stores, [0, 1, 2], 3) == {0: None, 1: None, 2: None}


def test_a_single_rank_generation_passes_alone():
    assert _arrive(_stores(1), [0], 1) == {0: None}


def test_a_missing_rank_fails_its_peers_naming_it_and_a_late_one_fails_too():
    stores = _stores(3)
    got = _arrive(stores, [0, 2], 3)  # rank 1 never comes
    for rank in (0, 2):
        assert isinstance(got[rank], TimeoutError), got
        assert "rank(s) [1] of generation 7" in str(got[rank]) and f"{WAIT_S:g} s" in str(got[rank])
    late = _arrive(stores, [1], 3)[1]  # it comes after all: everyone checked in, but too late
    assert isinstance(late, TimeoutError) and "after its peers gave up" in str(late), late
