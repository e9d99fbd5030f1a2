"""Fencing a rank the coordinator declared lost: the job takes nothing more from it.

The rule, without namespaces: a rank of generation g that writes after the coordinator fenced it
(moved to g+1 without it) is refused by the real Dask scheduler — events, status, rendezvous,
start mark — and its checkpoint never replaces the last one; its results are left out of the
job's records. The many-host system tests (tests/test_many_hosts_system.py) show the same for a
cut link healed and a frozen host thawed.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from distributed import Client, LocalCluster

from elastic_tasks.board import EventKind, Fenced, JobBoard, JobStatus, RankEvent
from elastic_tasks.coordinator.outcomes import gather
from elastic_tasks.coordinator.recovery import REPORT_GRACE_S, report_deadline
from elastic_tasks.protocol import RankExit, RankResult, StepRecord
from elastic_tasks.rank.scaling import LRRamp
from elastic_tasks.rank.state.checkpoint_files import CHECKPOINT_NAME, META_NAME
from elastic_tasks.rank.state.checkpoint_writer import CheckpointWriter, CommitGuard
from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta, read_checkpoint, write_checkpoint

JOB = "job-fence"
SURVIVOR, LOST = f"{JOB}-r0", f"{JOB}-r1"
G = 3  # the generation the coordinator declares LOST lost in; it moves on to G + 1


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def _status(writer: str, version: int, step: int) -> JobStatus:
    return JobStatus(version=version, step=step, samples_seen=8 * step, world_size=2, global_batch=8, loss=1.0 / (step + 1), time=float(step), writer=writer)


def test_the_scheduler_refuses_every_write_of_a_fenced_rank_and_takes_the_others(client):
    coordinator = JobBoard(JOB, client)
    survivor, lost = JobBoard(JOB, client, writer=SURVIVOR), JobBoard(JOB, client, writer=LOST)
    assert survivor.mark_started(SURVIVOR) and lost.mark_started(LOST)
    assert not lost.mark_started(LOST)  # a re-run of its task, before any fence
    before = RankEvent(EventKind.FAILED, LOST, G, 7, time=1.0)
    lost.post(before)
    lost.set_status(_status(LOST, G, 7))
    lost.set_rendezvous(G, "10.0.0.2", 29500)
    assert coordinator.drain(timeout=0.1) == [before]  # written before the fence: taken

    coordinator.fence([LOST], G)

    for write in (
        lambda: lost.post(RankEvent(EventKind.FAILED, LOST, G, 8, time=2.0)),
        lambda: lost.set_status(_status(LOST, G, 8)),
        lambda: lost.set_rendezvous(G + 1, "10.0.0.2", 29501),
    ):
        with pytest.raises(Fenced) as refused:
            write()
        assert refused.value.uid == LOST and refused.value.version == G
    assert not lost.mark_started(LOST)
    with pytest.raises(Fenced):
        lost.confirm_writer()
    survivor.confirm_writer()  # not fenced: no error

    after = RankEvent(EventKind.APPLIED, SURVIVOR, G + 1, 7, world_size=1, time=3.0)
    survivor.post(after)
    assert coordinator.drain(timeout=0.1) == [after]  # the survivor's, none of the lost rank's
    assert coordinator.status() == _status(LOST, G, 7)  # its last status from before the fence, not step 8
    survivor.set_status(_status(SURVIVOR, G + 1, 8))
    assert coordinator.status() == _status(SURVIVOR, G + 1, 8)
    survivor.set_rendezvous(G + 1, "10.0.0.1", 29502)
    assert coordinator.rendezvous(G + 1, timeout=5) == ("10.0.0.1", 29502)

    fenced = coordinator.fenced()
    assert set(fenced) == {LOST} and fenced[LOST][0] == G
    ledger = coordinator.ledger()
    # By hand: LOST's start mark, event, status and rendezvous went in (its second start mark
    # was a re-run: answered, not written, yet counted as no refusal); after the fence its
    # event, status, rendezvous and start mark were refused.
    assert (ledger[LOST].refused, ledger[SURVIVOR].refused) == (4, 0)
    assert ledger[LOST].accepted == 4 and ledger[SURVIVOR].accepted == 4
    assert 0 < ledger[LOST].last_accepted <= fenced[LOST][1] <= ledger[SURVIVOR].last_accepted
    coordinator.forget()


def _state(step: int) -> ElasticState:
    torch.manual_seed(step)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return ElasticState(model, opt, TrainMeta(step=step, samples_seen=8 * step, global_batch=8, lr=LRRamp(0.1, 0.1), rng_state=b""))


def _fenced_confirm() -> None:
    raise Fenced(LOST, G)


def test_a_fenced_ranks_checkpoint_never_replaces_the_last_one(tmp_path):
    write_checkpoint(tmp_path, _state(10).snapshot(), CommitGuard(SURVIVOR, lambda: G + 1, lambda: None))
    kept = {name: (tmp_path / name).read_bytes() for name in (CHECKPOINT_NAME, META_NAME)}
    saved = read_checkpoint(tmp_path)
    assert saved["writer"] == {"uid": SURVIVOR, "generation": G + 1} and saved["meta"]["step"] == 10

    with pytest.raises(Fenced):  # the lost rank, back from a freeze, had a checkpoint of step 9 in hand
        write_checkpoint(tmp_path, _state(9).snapshot(), CommitGuard(LOST, lambda: G, _fenced_confirm))
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == kept  # no temp file either

    writer = CheckpointWriter(CommitGuard(LOST, lambda: G, _fenced_confirm))  # the background writer: same rule
    writer.save(_state(9), tmp_path)
    with pytest.raises(Fenced):
        writer.wait()
    assert writer.written == 0
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == kept


def test_the_board_check_stops_a_fenced_ranks_checkpoint(client, tmp_path):
    coordinator, lost = JobBoard(f"{JOB}-ckpt", client), JobBoard(f"{JOB}-ckpt", client, writer=LOST)
    guard = CommitGuard(LOST, lambda: G, lost.confirm_writer)
    _state(5).save(tmp_path, guard)  # not fenced yet: committed
    assert read_checkpoint(tmp_path)["writer"] == {"uid": LOST, "generation": G}
    coordinator.fence([LOST], G)
    with pytest.raises(Fenced):
        _state(6).save(tmp_path, guard)
    assert read_checkpoint(tmp_path)["meta"]["step"] == 5
    coordinator.forget()


def _record(step: int, world: int) -> StepRecord:
    return StepRecord(step=step, loss=1.0 / (step + 1), accuracy=0.5, world_size=world, global_batch=8, lr=0.1)


def test_a_fenced_ranks_results_never_reach_the_jobs_records():
    survivor = RankResult(SURVIVOR, RankExit.FINISHED, step=6, samples_seen=48, history=tuple(_record(s, 2 if s < 3 else 1) for s in range(6)))
    # Thawed, it trained on alone for a while before it found out: more steps, another history.
    lost = RankResult(LOST, RankExit.FENCED, step=9, samples_seen=72, history=tuple(dataclasses.replace(_record(s, 2), loss=9.0) for s in range(9)))
    result = gather(JOB, True, [survivor, lost], (), (), (), fenced=frozenset({LOST}))
    assert result.ranks == (survivor,)
    assert (result.steps, result.samples_seen) == (6, 48)
    assert result.history == survivor.history
    unfenced = gather(JOB, True, [survivor, lost], (), (), ())
    assert unfenced.steps == 9  # without the fence its figures would have won


def test_recovery_waits_only_the_grace_for_a_member_its_peers_already_waited_a_timeout_for():
    t0, timeout = 100.0, 5.0
    assert report_deadline(t0, timeout, blocked_s=timeout + 0.2) == t0 + REPORT_GRACE_S  # a silent peer
    assert report_deadline(t0, timeout, blocked_s=0.3) == t0 + timeout + REPORT_GRACE_S  # a fast failure: others may still be blocked
    assert report_deadline(t0, timeout, blocked_s=0.0) == t0 + timeout + REPORT_GRACE_S
    # A member yet to report whose worker still heartbeats is slow, not gone: the longer wait.
    assert report_deadline(t0, timeout, blocked_s=timeout + 0.2, silent_heard_of=True) == t0 + timeout + REPORT_GRACE_S


def test_the_scheduler_still_hears_from_a_running_worker(client):
    """What recovery asks before giving a silent member only the grace: a live worker's
    heartbeat is recent; an address that is no worker has no age."""
    from elastic_tasks.cluster import WorkerPool

    (addr,) = client.scheduler_info()["workers"]
    ages = WorkerPool(client).heartbeat_ages([addr, "tcp://10.213.0.99:1"])
    assert set(ages) == {addr} and 0 <= ages[addr] < 3.0
