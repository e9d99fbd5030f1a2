"""A collective whose peer died is a ``CollectiveFailure``; a recipe's own error is not.

Two real gloo processes: the peer dies (``os._exit``) once the group and two DDP wrappers
are set up, and the survivor meets the dead peer in each place the trainer calls into the
group. gloo says so only in a plain ``RuntimeError``'s text, which is what the trainer
used to match on.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.rank.health.collective import CollectiveFailure, HookWitness, collective
from elastic_tasks.rank.health import gradient_hook
from elastic_tasks.rank.health.abandon import DataPlaneWaits
from tests.gloo_pair import run_pair

pytestmark = pytest.mark.timeout(120)


def _ddp(witness: HookWitness) -> DistributedDataParallel:
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Linear(4, 2), init_sync=False)
    gradient_hook.install(ddp, DataPlaneWaits(), witness)  # the trainer's hook, watched
    return ddp


def _step(ddp: DistributedDataParallel, witness: HookWitness) -> None:
    with witness.step_collectives("step"):
        ddp(torch.ones(3, 4)).sum().backward()


def _outcome(fn) -> dict[str, str]:  # noqa: ANN001
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test reports whatever came out
        return {"type": type(exc).__name__, "cause": type(exc.__cause__).__name__, "text": str(exc)[:300]}
    return {"type": "none", "cause": "", "text": ""}


def _rank(rank: int, init_file: str, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    witness = HookWitness()
    fresh, warm = _ddp(witness), _ddp(witness)
    _step(fresh, witness)  # one step: its next forward rebuilds DDP's buckets (a broadcast)
    for _ in range(3):
        _step(warm, witness)  # buckets rebuilt: its next collective is the gradient allreduce
    dist.barrier()
    if rank == 1:
        os._exit(0)  # the peer dies without a word, as a killed worker does
    time.sleep(1.0)  # let the survivor's gloo pairs see the closed connection
    report = {
        "allreduce": _outcome(lambda: _allreduce()),
        "forward": _outcome(lambda: _step(fresh, witness)),
        "backward": _outcome(lambda: _step(warm, witness)),
    }
    with open(out_file, "w") as fh:
        json.dump(report, fh)
    os._exit(0)  # no teardown of a group whose peer is gone (gloo may abort on it)


def _allreduce() -> None:
    with collective("agreement"):
        dist.all_reduce(torch.ones(3), async_op=True).wait()


def test_a_dead_peer_surfaces_as_collective_failure_at_every_call_site(tmp_path):
    out = tmp_path / "report.json"
    run_pair(_rank, tmp_path, out)
    report = json.loads(out.read_text())
    for where, got in report.items():
        # torch's own error is kept as the cause: gloo's plain RuntimeError naming the closed peer
        assert got["type"] == "CollectiveFailure", (where, got)
        assert got["cause"] == "RuntimeError", (where, got)


class _Broken(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("connection to the feature store timed out")  # the words gloo uses, not gloo


def test_a_recipes_own_error_is_not_a_collective_failure():
    witness = HookWitness()
    with pytest.raises(RuntimeError, match="feature store") as info:
        with witness.step_collectives("step"):
            _Broken()(torch.ones(1))
    assert not isinstance(info.value, CollectiveFailure)
