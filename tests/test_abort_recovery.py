"""Issue 34.4: after the hang watch aborts a generation's group, the rank recovers.

Two real gloo processes and the real abort (``abort_communicators``: torch's
``_abort_process_group``, which unregisters the group). Rank 1 stays alive and silent, as a hung
peer does. Rank 0 sits in a data-plane region the way a GPU rank's host sits in a sync on a
hung nccl kernel, until the watch, told by its control plane that the generation lost a member,
aborts the group; then, as on nccl, the host goes on to the step's agreement. The agreement
meets the aborted group (torch raises ``ValueError`` there: no default group), and that must be
a ``CollectiveFailure`` — the rank's way into recovery — not an error that ends the rank. The
drop path then leaves the aborted group alone, and the next generation's group forms and agrees.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.rank.agreement import Agreement, StepOutcome
from elastic_tasks.rank.health.collective import CollectiveFailure, HookWitness
from elastic_tasks.rank.health import gradient_hook
from elastic_tasks.rank.health.hang_watch import HangWatch
from elastic_tasks.rank.process_group import ProcessGroups
from tests.gloo_pair import run_pair

pytestmark = pytest.mark.timeout(120)
BOUND_S = 60.0  # only a bound on a hang of the test itself


def _outcome(step: int, rank: int) -> StepOutcome:
    # Rank r's 4 samples: losses summing to (r + 1) * (step + 1), 2 of them correct.
    return StepOutcome(step, float((rank + 1) * (step + 1)), 2.0, 4, throughput=100.0, global_batch=8, lr=0.1, t0=time.perf_counter(), cpu0=time.process_time())


class _ControlPlane:
    """The board's answer to "which generation lost a member", set by the rank under test."""

    def __init__(self) -> None:
        self.lost = -1

    def lost_generation(self) -> int:
        return self.lost


def _held_until_aborted() -> None:
    """A GPU host in a sync on a hung nccl kernel: it returns once the communicator is aborted."""
    deadline = time.monotonic() + BOUND_S
    while dist.is_initialized():
        if time.monotonic() > deadline:
            raise TimeoutError("the watch never aborted the group")
        time.sleep(0.01)


def _failure(fn) -> dict[str, str]:  # noqa: ANN001
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test reports whatever came out
        return {"type": type(exc).__name__, "cause": type(exc.__cause__).__name__, "text": str(exc)[:300]}
    return {"type": "none", "cause": "", "text": ""}


def _rank(rank: int, init_file: str, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(0)
    control = _ControlPlane()
    watch = HangWatch(control.lost_generation, data_timeout_s=3600.0, poll_s=0.02)  # the real abort
    witness = HookWitness(lambda: watch.aborted(1))  # as the trainer's: is the group in effect aborted?
    ddp = DistributedDataParallel(nn.Linear(4, 2), init_sync=False)
    gradient_hook.install(ddp, watch.waits, witness)  # the trainer's watched hook
    for _ in range(2):
        ddp(torch.ones(3, 4)).sum().backward()
    agreement = Agreement(rank, 2, watch.waits)
    assert agreement.issue(_outcome(0, rank), seen_version=1, noise_scale=None) is None
    dist.barrier()  # step 0's agreement has completed on both ranks
    done = Path(out_file).with_suffix(".done")
    if rank == 1:  # alive and silent, as a hung peer is, until rank 0 is through
        deadline = time.monotonic() + BOUND_S
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(0)
    watch.start()

    def step_1() -> None:
        with watch.data_plane(1, "a training step"):
            control.lost = 1  # the coordinator declares generation 1 lost
            _held_until_aborted()
            agreement.issue(_outcome(1, rank), seen_version=1, noise_scale=None)  # the next agreement

    def ddp_step() -> None:  # DDP still holds the aborted group: its hook must not call into it
        with watch.data_plane(1, "a training step"), witness.step_collectives("step 2"):
            ddp(torch.ones(3, 4)).sum().backward()

    report: dict[str, object] = {"agreement": _failure(step_1), "ddp": _failure(ddp_step)}
    watch.stop()
    # The drop path: what completed before the abort keeps its record; the aborted group is left alone.
    salvaged = agreement.salvage(noise_scale=None)
    report["salvaged"] = None if salvaged is None else [salvaged.record.step, salvaged.record.loss]
    report["drop"] = _failure(lambda: ProcessGroups.drop(aborted=watch.aborted(1)))
    report["aborted"] = [watch.aborted(0), watch.aborted(1)]
    # The next generation: the survivor alone, on a fresh store.
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    nxt = Agreement(0, 1, watch.waits)
    with watch.data_plane(2, "a training step"):
        nxt.issue(_outcome(2, 0), seen_version=2, noise_scale=None)
    with watch.data_plane(2, "agreement"):
        agreed = nxt.settle(noise_scale=None)
    report["next_generation"] = [agreed.record.step, agreed.record.loss, agreed.record.world_size]
    dist.destroy_process_group()
    Path(out_file).write_text(json.dumps(report))
    done.touch()
    os._exit(0)


def test_after_the_real_abort_the_next_agreement_sends_the_rank_to_recovery(tmp_path):
    out = tmp_path / "report.json"
    run_pair(_rank, tmp_path, out)
    report = json.loads(out.read_text())
    # The agreement met the aborted group: a collective failure, torch's ValueError its cause.
    assert report["agreement"]["type"] == "CollectiveFailure", report["agreement"]
    assert report["agreement"]["cause"] == "ValueError", report["agreement"]
    assert "communicator aborted: the control plane declared a member of generation 1 lost" in report["agreement"]["text"]
    # At once, not once the silent peer's sockets close (gloo's allreduce on an aborted group waits).
    assert report["ddp"]["type"] == "CollectiveFailure" and "the group was aborted" in report["ddp"]["text"], report["ddp"]
    assert report["aborted"] == [False, True]
    # Step 0's agreement completed before the abort: (1 + 2) / 8 loss over both ranks.
    assert report["salvaged"] == [0, 3 / 8]
    assert report["drop"]["type"] == "none", report["drop"]
    # The survivor's own generation: 3 * 1 / 8 (its loss sum over the global batch), one rank.
    assert report["next_generation"] == [2, 3 / 8, 1]


def test_a_region_ends_in_collective_failure_once_its_generation_was_aborted():
    """Without a real group: whatever leaves an aborted generation's region — an error of any
    type, or nothing — is a CollectiveFailure; other generations' regions are untouched."""
    control, aborted = _ControlPlane(), []
    watch = HangWatch(control.lost_generation, data_timeout_s=3600.0, abort=lambda: aborted.append(True), poll_s=0.02)
    watch.start()
    try:
        with pytest.raises(ValueError, match="recipe"):  # generation 3 not aborted: the error is the recipe's
            with watch.data_plane(3, "a training step"):
                raise ValueError("recipe")
        with pytest.raises(CollectiveFailure, match="communicator aborted") as clean:
            with watch.data_plane(3, "a training step"):
                control.lost = 3
                deadline = time.monotonic() + BOUND_S
                while not aborted and time.monotonic() < deadline:
                    time.sleep(0.01)
        assert clean.value.__cause__ is None  # nothing raised inside: the abort alone ends the region
        with pytest.raises(CollectiveFailure) as info:
            with watch.data_plane(3, "agreement"):
                raise ValueError("Default process group has not been initialized")
        assert isinstance(info.value.__cause__, ValueError)
        with watch.data_plane(4, "DDP set-up"):  # the next generation starts clean
            pass
    finally:
        watch.stop()
    assert aborted == [True] and watch.aborted(3) and not watch.aborted(4)
