"""A peer that answers nothing (SIGSTOP: a frozen host, a silent partition) no longer holds a gloo
survivor in a data-plane wait until gloo's own timeout: the control plane's word frees it.

Real gloo processes. One survivor lives through three generations, each with a new peer that
freezes itself (SIGSTOP) just before one data-plane wait — the gradient allreduce inside DDP's
``backward()``, the end-of-step agreement's read, the state broadcast. The test (standing for
the coordinator) sees the peer stopped and says so (the board's word: the lost generation);
the survivor's ``HangWatch`` must then free it with ``CollectiveFailure`` within its poll, not
at the data timeout (600 s, also gloo's own timeout here). Each abandoned group is destroyed at
once, and a fourth generation forms and trains normally.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.rank.agreement import Agreement, StepOutcome
from elastic_tasks.rank.health import gradient_hook
from elastic_tasks.rank.health.collective import CollectiveFailure, HookWitness
from elastic_tasks.rank.health.hang_watch import HangWatch
from elastic_tasks.rank.process_group import ProcessGroups
from elastic_tasks.rank.scaling import LRRamp
from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta
from tests.gloo_pair import rank_context

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SITES = ("gradient allreduce", "agreement", "state broadcast")
DATA_TIMEOUT_S = 600.0  # gloo's own timeout and the watch's: the bound the fix must beat by far
FREED_WITHIN_S = 20.0  # the watch's poll and board cadence are ~2 s; generous for a loaded box
RESULT_WAIT_S = 150.0


def _group(version: int, rank: int, world: int, port: int | None, ports) -> None:  # noqa: ANN001
    timeout = timedelta(seconds=DATA_TIMEOUT_S)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
        if world > 1:
            ports.put((version, store.port))
    else:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    _group.store = store  # type: ignore[attr-defined]  # kept alive for the group's life


class _Lockstep:
    """What both ranks of a generation run, the trainer's pieces in the trainer's order."""

    def __init__(self, version: int, rank: int, world: int, watch: HangWatch) -> None:
        torch.manual_seed(0)
        self.version, self.rank, self.world, self.watch = version, rank, world, watch
        self.model = nn.Linear(4, 2)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.witness = HookWitness()
        self.ddp = DistributedDataParallel(self.model, init_sync=False)
        gradient_hook.install(self.ddp, watch.waits, self.witness)
        self.agreement = Agreement(rank, world, watch.waits)
        self.step = 0

    def backward(self) -> None:
        self.opt.zero_grad()
        with self.witness.step_collectives(f"step {self.step}"):
            self.ddp(torch.ones(3, 4)).sum().backward()
        self.opt.step()

    def agree(self) -> None:
        outcome = StepOutcome(self.step, 1.0, 1.0, 2, 100.0, 2 * self.world, 0.1, time.perf_counter(), time.process_time())
        self.agreement.issue(outcome, seen_version=self.version, noise_scale=None)
        self.step += 1

    def broadcast(self) -> None:
        meta = TrainMeta(step=self.step, samples_seen=0, global_batch=4, lr=LRRamp(0.1, 0.1), rng_state=b"")
        ElasticState(self.model, self.opt, meta).broadcast(src=1, waits=self.watch.waits)


def _warm(lock: _Lockstep) -> None:
    for _ in range(3):  # DDP rebuilds its buckets after its first step: past that, the hook's allreduce
        with lock.watch.data_plane(lock.version, "a training step"):
            lock.backward()
            lock.agree()


def _peer(version: int, site: str, ports) -> None:  # noqa: ANN001
    torch.set_num_threads(1)
    got, port = ports.get(timeout=RESULT_WAIT_S)
    assert got == version
    _group(version, 1, 2, port, None)
    lock = _Lockstep(version, 1, 2, HangWatch(lambda: -1, DATA_TIMEOUT_S, abort=lambda: None))
    _warm(lock)
    if site == "agreement":
        lock.backward()
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen before its next collective: it answers nothing
    time.sleep(3600)


def _survivor(out: str, ports, lost, word_at, entered) -> None:  # noqa: ANN001
    torch.set_num_threads(1)
    watch = HangWatch(lambda: lost.value, DATA_TIMEOUT_S, abort=lambda: None)  # gloo: nothing to abort
    watch.start()
    report = []
    for version, site in enumerate(SITES):
        _group(version, 0, 2, None, ports)
        lock = _Lockstep(version, 0, 2, watch)
        _warm(lock)
        try:
            with watch.data_plane(version, site):
                entered.set()  # the test gives the word once the survivor is here (it may not block yet)
                if site == "gradient allreduce":
                    lock.backward()
                elif site == "agreement":
                    lock.backward()
                    lock.agree()
                    lock.agreement.settle(noise_scale=None)
                else:
                    lock.broadcast()
            outcome = "completed"
        except CollectiveFailure as exc:
            outcome = str(exc)
        freed_after = time.time() - word_at.value if word_at.value else -1.0
        del lock
        t0 = time.monotonic()
        ProcessGroups.drop()  # the trainer's: destroy_process_group, with the stuck collective in flight
        report.append({"site": site, "outcome": outcome, "freed_after_s": freed_after, "drop_s": time.monotonic() - t0})
    _group(len(SITES), 0, 1, None, ports)  # the next generation forms as usual
    lock = _Lockstep(len(SITES), 0, 1, watch)
    _warm(lock)
    with watch.data_plane(len(SITES), "settle"):
        lock.agreement.settle(noise_scale=None)
    report.append({"site": "next generation", "steps": lock.step, "zombies": len(watch.waits.zombies)})
    Path(out).write_text(json.dumps(report))
    os._exit(0)  # the frozen peers' groups are not torn down


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_frozen_peer_frees_the_survivor_at_the_control_planes_word(tmp_path):
    ctx = rank_context()
    ports, lost, word_at, entered = ctx.Queue(), ctx.Value("i", -1), ctx.Value("d", 0.0), ctx.Event()
    out = tmp_path / "report.json"
    survivor = ctx.Process(target=_survivor, args=(str(out), ports, lost, word_at, entered))
    survivor.start()
    peers = []
    try:
        for version, site in enumerate(SITES):
            peer = ctx.Process(target=_peer, args=(version, site, ports))
            peer.start()
            peers.append(peer)
            deadline = time.monotonic() + RESULT_WAIT_S
            while not _stopped(peer.pid):
                assert time.monotonic() < deadline and survivor.is_alive(), f"peer of generation {version} never froze"
                time.sleep(0.05)
            assert entered.wait(RESULT_WAIT_S), f"the survivor never reached the {site}"
            entered.clear()
            word_at.value = time.time()
            lost.value = version  # the coordinator's word: generation `version` lost a member
        survivor.join(RESULT_WAIT_S)
        assert survivor.exitcode == 0, "the survivor stayed blocked in a data-plane wait"
    finally:
        for p in (survivor, *peers):
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(10)
    report = json.loads(out.read_text())
    for site, entry in zip(SITES, report, strict=False):
        assert entry["site"] == site
        assert f"data-plane wait of generation {SITES.index(site)} abandoned" in entry["outcome"], entry
        assert 0 <= entry["freed_after_s"] < FREED_WITHIN_S, entry  # the word, not gloo's 600 s
        assert entry["drop_s"] < FREED_WITHIN_S, entry  # the abandoned group is destroyed at once
    assert report[-1]["site"] == "next generation" and report[-1]["steps"] == 3
