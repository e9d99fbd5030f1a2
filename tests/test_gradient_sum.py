"""The trainer's gradient allreduce is a plain SUM over losses weighted by their share of the
global batch (issue 34: no extra pass over the gradients to average them), and gives the
global batch's mean gradient even when ranks hold uneven shares.

Two real gloo ranks: rank 0 takes 4 samples in two accumulated micro-batches (3 + 1, the
first under ``no_sync``), rank 1 takes 3 — a global batch of 7. The oracle is one process's
gradient of the mean loss over all 7 samples. A textbook DDP (its default averaging hook)
given the same uneven shares averages the two ranks' means instead — a different gradient,
which is why the weighting is needed.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.rank.health import gradient_hook
from elastic_tasks.rank.health.abandon import DataPlaneWaits
from elastic_tasks.rank.health.collective import HookWitness
from elastic_tasks.rank.scaling import loss_weight
from tests.gloo_pair import run_pair

pytestmark = pytest.mark.timeout(120)

GLOBAL = 7
SHARES = {0: [(0, 3), (3, 4)], 1: [(4, 7)]}  # [start, stop) micro-batches of the global batch


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(GLOBAL, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (GLOBAL,), generator=g)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _grads(model: nn.Module) -> list[list[float]]:
    return [p.grad.reshape(-1).tolist() for p in model.parameters()]


def _rank(rank: int, init_file: str, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    x, y = _data()
    summed = DistributedDataParallel(_model(), init_sync=False)
    gradient_hook.install(summed, DataPlaneWaits(), HookWitness())  # the trainer's hook
    chunks = SHARES[rank]
    for i, (a, b) in enumerate(chunks):
        last = i == len(chunks) - 1
        with summed.no_sync() if not last else contextlib.nullcontext():
            (F.cross_entropy(summed(x[a:b]), y[a:b]) * loss_weight(b - a, GLOBAL)).backward()
    averaged = DistributedDataParallel(_model(), init_sync=False)  # DDP's own hook: a mean of the ranks' means
    a, b = chunks[0][0], chunks[-1][1]
    F.cross_entropy(averaged(x[a:b]), y[a:b]).backward()
    if rank == 0:
        with open(out_file, "w") as fh:
            json.dump({"summed": _grads(summed.module), "averaged": _grads(averaged.module)}, fh)
    dist.destroy_process_group()


def test_weighted_sum_is_the_global_mean_gradient(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "grads.json"
    run_pair(_rank, tmp_path, out)
    got = json.loads(out.read_text())
    x, y = _data()
    oracle = _model()
    F.cross_entropy(oracle(x), y).backward()  # one process, the whole batch: the mean gradient
    want = [p.grad.reshape(-1) for p in oracle.parameters()]
    for g, w in zip(got["summed"], want, strict=True):
        torch.testing.assert_close(torch.tensor(g, dtype=torch.float64), w, rtol=1e-10, atol=1e-12)
    # The uneven split matters: averaging the ranks' means is not the global mean here.
    differs = [not torch.allclose(torch.tensor(g, dtype=torch.float64), w, rtol=1e-6, atol=1e-9) for g, w in zip(got["averaged"], want, strict=True)]
    assert any(differs)
