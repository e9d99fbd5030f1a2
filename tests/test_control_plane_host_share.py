"""Control plane at scale, per-host aggregation (elastic_tasks/rank/host_share.py): one rank per
host reads each plan as it is published and leaves it in the host's shared memory; every rank of
the host takes it there at the boundary where it is due. And the fenced write's own scheduler
handler (board.WRITE_HANDLER), with and without the coordinator installing it first.

Real Dask scheduler (in-process LocalCluster), real TCPStores, real files; ranks are threads.
"""

from __future__ import annotations

import os
import pickle
import stat
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from distributed import Client, LocalCluster

from elastic_tasks.board import EventKind, JobBoard, RankEvent
from elastic_tasks.protocol import Plan, PlanKind, TrainConfig
from elastic_tasks.rank.host_share import HostShare


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def _plan(version: int, world: int = 4) -> Plan:
    return Plan(version, PlanKind.BATCH, tuple(f"u{i}" for i in range(world)), world * (2 + version))


def test_a_plan_put_by_one_share_is_read_by_another_and_only_the_newest_two_stay(tmp_path):
    leader, reader = HostShare("job.a1", root=str(tmp_path)), HostShare("job.a1", root=str(tmp_path))
    other_job = HostShare("job.b2", root=str(tmp_path))
    assert reader.get(1) is None  # nothing put yet, no directory yet
    for v in range(1, 6):
        assert leader.put(v, pickle.dumps(_plan(v)))
    assert pickle.loads(reader.get(5)) == _plan(5) and pickle.loads(reader.get(4)) == _plan(4)
    assert [reader.get(v) for v in (1, 2, 3)] == [None, None, None]  # older than the newest two: deleted
    assert other_job.get(5) is None  # another job's plans are its own
    entries = sorted(os.listdir(leader.path))
    assert entries == ["plan-4", "plan-5"]  # no temporary file left behind


def test_exactly_one_share_of_a_job_leads_a_host_and_another_takes_over_when_it_resigns(tmp_path):
    shares = [HostShare("job.c3", root=str(tmp_path)) for _ in range(8)]
    barrier = threading.Barrier(len(shares))
    won: list[int] = []
    lock = threading.Lock()

    def contend(i: int) -> None:
        barrier.wait()
        if shares[i].lead():
            with lock:
                won.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(shares))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(won) == 1
    first = won[0]
    assert shares[first].lead()  # asking again while leading: still the leader
    assert HostShare("job.d4", root=str(tmp_path)).lead()  # another job on the host: a leader of its own
    shares[first].put(1, pickle.dumps(_plan(1)))
    shares[first].resign()  # the rank leaves: its lock and the host's copies go
    assert not os.path.exists(shares[first].path)
    successor = next(s for i, s in enumerate(shares) if i != first)
    assert successor.lead() and successor.get(1) is None
    others = [s for i, s in enumerate(shares) if i != first and s is not successor]
    assert not any(s.lead() for s in others)
    successor.resign()


def test_a_directory_other_users_could_write_is_never_read(tmp_path):
    share = HostShare("job.e5", root=str(tmp_path))
    os.mkdir(share.path)
    os.chmod(share.path, 0o777)  # as if made by someone else for us to unpickle from
    with open(os.path.join(share.path, "plan-1"), "wb") as f:
        f.write(pickle.dumps(_plan(1)))
    assert share.get(1) is None and not share.put(2, b"x") and not share.lead()
    os.chmod(share.path, stat.S_IRWXU)  # this user's only: trusted
    assert pickle.loads(share.get(1)) == _plan(1)
    link = HostShare("job.f6", root=str(tmp_path))
    os.symlink(share.path, link.path)  # a link to a trusted directory is not the directory
    assert link.get(1) is None and not link.lead()


def test_ranks_take_a_due_plan_from_their_hosts_share_and_rank_0_still_feeds_the_store(client, tmp_path):
    from elastic_tasks.rank.accounting.wall_split import WallTimeline
    from elastic_tasks.rank.plan_switch import PlanSwitch

    board = JobBoard("share-switch", client)
    start, new = Plan(0, PlanKind.START, ("a", "b", "c"), 6), Plan(1, PlanKind.BATCH, ("a", "b", "c"), 12)
    board.publish(start)  # version 1 is never on the board: whoever holds it read it from the share
    HostShare("share-switch", root=str(tmp_path)).put(1, pickle.dumps(new))
    master = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    peer = dist.TCPStore("127.0.0.1", master.port, 3, is_master=False, timeout=timedelta(seconds=5))
    config = TrainConfig(global_batch=6, max_steps=100, timeout_s=0.5)
    switches = []
    for rank, store in ((0, master), (1, peer)):
        switch = PlanSwitch(board, config, WallTimeline(), HostShare("share-switch", root=str(tmp_path)))
        switch.fan_out_through(store, rank)
        switch.adopt(start)
        switches.append(switch)
    for switch in switches:
        assert switch.due(1, step=1) == new
    # Rank 0 put it on the generation's store too, for ranks on hosts whose share missed it.
    assert pickle.loads(master.get("malleable/plan/1")) == new


def test_the_hosts_leader_leaves_each_published_plan_in_the_share_without_watching(client, tmp_path):
    from elastic_tasks.rank.plan_watcher import Courier

    board = JobBoard("share-courier", client)
    leader, other = (Courier(board, HostShare("share-courier", root=str(tmp_path))) for _ in range(2))
    for c in (leader, other):
        c.watching = False  # neither is a stride watcher: only leading the host makes one ask
        c.start()
    try:
        published = {v: _plan(v) for v in (0, 1, 2)}
        reader = HostShare("share-courier", root=str(tmp_path))
        deadline = time.monotonic() + 20
        for v, plan in published.items():
            board.publish(plan)
            while reader.get(v) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pickle.loads(reader.get(v)) == plan
        assert [leader.share.leading, other.share.leading].count(True) == 1
        assert max(leader.seen_version, other.seen_version) == 2 and min(leader.seen_version, other.seen_version) == -1
    finally:
        for c in (leader, other):
            c.stop()
        for c in (leader, other):
            c.join(10)
    assert not os.path.exists(reader.path)  # the leader took the host's copies with it


def test_fenced_writes_reach_the_scheduler_with_or_without_the_coordinator_installing_the_handler():
    # A scheduler of its own: nobody installed the handler on it yet.
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster, Client(cluster) as c:
        coordinator, rank = JobBoard("handler", c), JobBoard("handler", c, writer="r1")
        rank.post(RankEvent(EventKind.READY, "r1", 0, 0, time=1.0))  # the rank installs it itself
        coordinator.serve_fenced_writes()  # installing again changes nothing
        rank.post(RankEvent(EventKind.APPLIED, "r1", 0, 3, time=2.0))
        coordinator.fence(["r1"], 0)
        refused = 0
        try:
            rank.post(RankEvent(EventKind.FAILED, "r1", 0, 4, time=3.0))
        except Exception as exc:  # noqa: BLE001 - the type is checked below
            refused = type(exc).__name__ == "Fenced"
        assert refused
        assert [e.kind for e in coordinator.drain(0.1)] == [EventKind.READY, EventKind.APPLIED]
        ledger = coordinator.ledger()["r1"]
        assert (ledger.accepted, ledger.refused) == (2, 1)


@pytest.mark.parametrize(
    "members",
    [tuple(f"job-r{i}" for i in range(1024)), (), ("",), ("", "b"), ("a\nb", "c"), ("only",)],
    ids=["1024", "none", "one-empty", "empty-first", "separator-inside", "one"],
)
def test_a_plan_comes_back_from_its_pickle_field_for_field(members):
    # The wire form joins members into one string where it can (Plan.__reduce__): whatever the
    # members, every field comes back the same, members a tuple again.
    kind = PlanKind.STOP if not members else PlanKind.RESCALE
    plan = Plan(7, kind, members, max(1, len(members)) * 3, at_step=None if not members else 12, source=members[-1] if members else None,
                accum_steps=None if not members else 3)
    back = pickle.loads(pickle.dumps(plan))
    assert type(back) is Plan and type(back.members) is tuple and back.kind is kind
    assert (back.version, back.members, back.global_batch, back.at_step, back.source, back.accum_steps) == (
        7, members, max(1, len(members)) * 3, plan.at_step, plan.source, plan.accum_steps)


def test_a_watcher_still_learns_of_a_plan_when_its_hosts_leader_hangs_holding_the_lock(client, tmp_path):
    from elastic_tasks.rank.plan_watcher import Courier

    board = JobBoard("share-hung", client)
    hung = HostShare("share-hung", root=str(tmp_path))
    assert hung.lead()  # leads, and never shares anything (a rank stuck with its lock held)
    watcher = Courier(board, HostShare("share-hung", root=str(tmp_path)))  # watching, as rank 0 does
    watcher.start()
    try:
        board.publish(_plan(0))
        deadline = time.monotonic() + 20
        while watcher.seen_version < 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watcher.seen_version == 0  # after its grace for the leader, not never
        assert not watcher.share.leading and hung.get(0) is None
    finally:
        watcher.stop()
        watcher.join(10)
        hung.resign()
