"""The control plane at scale (docs/elastic.md): plans due at a step boundary come through the
generation's TCPStore (rank 0 reads the board once), and only a few ranks long-poll the board.

Real Dask scheduler (in-process LocalCluster), real TCPStores, real JobBoard; ranks are threads.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from elastic_tasks.protocol import Plan, PlanKind, TrainConfig

WORLD = 12


@pytest.fixture()
def board():
    from distributed import Client, LocalCluster

    from elastic_tasks.board import JobBoard

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        yield JobBoard("fanout-test", client)


def _switches(board, stores, timeout_s=10.0):
    from elastic_tasks.rank.plan_switch import PlanSwitch
    from elastic_tasks.rank.accounting.wall_split import WallTimeline

    config = TrainConfig(global_batch=WORLD * 4, max_steps=100, timeout_s=timeout_s)
    switches = []
    for rank, store in enumerate(stores):
        switch = PlanSwitch(board, config, WallTimeline())
        switch.fan_out_through(store, rank)
        switches.append(switch)
    return switches


def _stores(world):
    master = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", master.port, world, is_master=False, timeout=timedelta(seconds=10)) for _ in range(world - 1)]
    return [master, *clients]


def test_every_rank_gets_each_published_plan_exactly_once_through_the_store(board):
    members = tuple(f"u{i}" for i in range(WORLD))
    start = Plan(0, PlanKind.START, members, WORLD * 2)
    board.publish(start)
    stores = _stores(WORLD)
    switches = _switches(board, stores)
    for s in switches:
        s.adopt(start)
    # What each version must read as, built here (not read back from the code under test).
    expected = {v: Plan(v, PlanKind.BATCH, members, WORLD * (2 + v)) for v in (1, 2, 3)}
    got: dict[tuple[int, int], list[Plan]] = {}
    lock = threading.Lock()

    def boundary(rank: int, newest: int, step: int) -> None:  # one rank at one step boundary
        plan = switches[rank].due(newest, step)
        if plan is not None:
            switches[rank].adopt(plan)
            with lock:
                got.setdefault((rank, plan.version), []).append(plan)

    step = 0
    for v, plan in expected.items():
        board.publish(plan)
        for _ in range(3):  # the agreed version stays v for a few boundaries: no second delivery
            step += 1
            threads = [threading.Thread(target=boundary, args=(r, v, step)) for r in range(WORLD)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
    assert sorted(got) == [(r, v) for r in range(WORLD) for v in expected]
    for (rank, v), plans in got.items():
        assert plans == [expected[v]], (rank, v)
    assert stores[0].check([f"malleable/plan/{v}" for v in expected])  # rank 0 put each one on the store


def test_a_rank_whose_store_is_gone_or_silent_reads_the_board(board):
    members = ("a", "b")
    board.publish(Plan(0, PlanKind.START, members, 4))
    new = Plan(1, PlanKind.BATCH, members, 8)
    board.publish(new)
    master = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    silent = dist.TCPStore("127.0.0.1", master.port, 2, is_master=False, timeout=timedelta(seconds=5))
    (rank1,) = _switches(board, [master], timeout_s=0.5)[:1]
    rank1.fan_out_through(silent, 1)  # rank 1: its rank 0 never puts the plan on the store
    rank1.adopt(Plan(0, PlanKind.START, members, 4))
    t0 = time.monotonic()
    assert rank1.due(1, step=1) == new
    assert time.monotonic() - t0 < 5  # bounded by timeout_s (0.5 s), not the store's own 5 s + retries
    # The store's host gone: the board answers.
    other = _switches(board, [master])[0]
    gone = dist.TCPStore("127.0.0.1", master.port, 2, is_master=False, timeout=timedelta(seconds=5))
    del master
    other.fan_out_through(gone, 1)
    other.adopt(Plan(0, PlanKind.START, members, 4))
    t0 = time.monotonic()
    assert other.due(1, step=1) == new
    assert time.monotonic() - t0 < 5  # the store failed at once (its default wait here is 10 s)


def test_only_watching_couriers_long_poll_the_board(board):
    from elastic_tasks.rank.plan_watcher import Courier, watches

    # Rank 0 always watches; at 1,024 ranks a few dozen at most ask the scheduler (issue 33's budget).
    assert watches(0)
    assert sum(watches(r) for r in range(1024)) <= 32
    watcher, idle = Courier(board), Courier(board)
    idle.watching = False
    for c in (watcher, idle):
        c.start()
    try:
        time.sleep(0.3)
        board.publish(Plan(0, PlanKind.START, ("a",), 1))
        deadline = time.monotonic() + 10
        while watcher.seen_version < 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watcher.seen_version == 0
        time.sleep(2.5)  # past the watcher's backup poll period: a non-watcher still learned nothing
        assert idle.seen_version == -1
        assert idle.refresh() == 0  # recovery's direct read still works for every rank
    finally:
        for c in (watcher, idle):
            c.stop()
