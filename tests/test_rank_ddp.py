"""The rank's DDP is built on the torch installed, whichever name its buffer-sync keyword has.

torch 2.13 calls it ``forward_sync_buffers`` (``broadcast_buffers`` deprecated); the torch on
the lent H200 (2.11) knows only ``broadcast_buffers`` and refused the new name, failing every
rank there. The names below are the two releases' ``__init__`` parameters as published.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn

from elastic_tasks.rank.forward import no_forward_buffer_sync, rank_ddp
from elastic_tasks.recipe import TrainingRecipe

OLD_DDP = ("self", "module", "device_ids", "output_device", "dim", "broadcast_buffers", "init_sync", "process_group", "bucket_cap_mb")
NEW_DDP = (*OLD_DDP, "skip_all_reduce_unused_params", "forward_sync_buffers")


def test_the_keyword_is_the_one_the_installed_ddp_accepts() -> None:
    assert no_forward_buffer_sync(OLD_DDP) == {"broadcast_buffers": False}
    assert no_forward_buffer_sync(NEW_DDP) == {"forward_sync_buffers": False}


def test_a_rank_ddp_builds_without_deprecation_and_broadcasts_no_buffers(tmp_path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))  # buffers: what the per-forward broadcast would send
        recipe = TrainingRecipe(name="t", build_model=lambda: model, dataset=[(torch.randn(3), 0)], loss_fn=nn.functional.cross_entropy, make_optimizer=torch.optim.SGD, base_lr=0.1, base_batch=5)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            ddp = rank_ddp(model, recipe)
        assert ddp.broadcast_buffers is False
        x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0])
        loss, hits = ddp((x, y))
        loss.backward()
        want = nn.functional.cross_entropy(model(x), y)  # the same model, the loss written out here
        assert torch.allclose(loss, want) and int(hits) == int((model(x).argmax(1) == y).sum())
        assert model[0].weight.grad is not None
    finally:
        dist.destroy_process_group()
