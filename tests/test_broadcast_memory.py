"""Issue 22.3: a grow costs each rank at most one bounded chunk, and survivors keep their state.

Three real gloo ranks: ranks 0 and 1 are survivors (same structure, different values: only the
broadcast can make them equal), rank 2 joins with an empty optimizer. The broadcast counts the
staging buffers it allocates (``BroadcastStats``; torch's allocations are invisible to
tracemalloc); the oracle for the new rank's own state is computed here from the parameter shapes.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from elastic_tasks.rank.scaling import LRRamp
from tests.gloo_pair import run_ranks
from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CHUNK = 16 * 1024  # bytes: smaller than the big weights (64 KiB, 256 KiB), larger than every bias
WORLD = 3


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.BatchNorm1d(256), nn.Linear(256, 10))


def _opt_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def _worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(rank)
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        meta = TrainMeta(step=0, samples_seen=0, global_batch=8, lr=LRRamp(0.01, 0.01), rng_state=b"")
        state = ElasticState(model, opt, meta)
        if rank < 2:  # survivors: Adam state exists; the values differ between them
            for _ in range(2 + rank):
                opt.zero_grad()
                model(torch.randn(16, 64)).pow(2).mean().backward()
                opt.step()
            state.meta = TrainMeta(step=5, samples_seen=40, global_batch=8, lr=LRRamp(0.01, 0.01), rng_state=b"")
        before = [t.data_ptr() for t in _opt_tensors(opt)]
        state.capture_rng()
        stats = state.broadcast(src=0, chunk_bytes=CHUNK)
        after = [t.data_ptr() for t in _opt_tensors(opt)]
        own = sum(2 * p.numel() * p.element_size() + torch.tensor(0.0).element_size() for p in model.parameters())
        torch.save(
            {
                "stats": (stats.peak_buffer_bytes, stats.materialised_bytes, stats.kept_optimizer_state, stats.collectives, stats.in_place),
                "same_tensors": before == after and len(before) > 0,
                "own_optimizer_bytes": own,
                "model": {k: v.clone() for k, v in model.state_dict().items()},
                "opt": [t.clone() for t in _opt_tensors(opt)],
                "step": state.meta.step,
                "total_bytes": sum(t.numel() * t.element_size() for t in [*model.state_dict().values(), *_opt_tensors(opt)]),
            },
            f"{out}/{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def test_a_grow_allocates_at_most_one_chunk_and_survivors_keep_their_tensors(tmp_path):
    run_ranks(_worker, (f"file://{tmp_path}/store", str(tmp_path)), WORLD)
    r = [torch.load(tmp_path / f"{i}.pt", weights_only=False) for i in range(WORLD)]
    for i in (1, 2):
        for k in r[0]["model"]:
            assert torch.equal(r[0]["model"][k], r[i]["model"][k]), (i, k)
        assert len(r[i]["opt"]) == len(r[0]["opt"]) > 0
        assert all(torch.equal(a, b) for a, b in zip(r[0]["opt"], r[i]["opt"], strict=True)), i
        assert r[i]["step"] == 5
    for i in range(WORLD):
        peak, materialised, kept, collectives, in_place = r[i]["stats"]
        assert 0 < peak <= CHUNK, (i, peak)  # one bounded staging buffer, never the whole state
        assert peak < r[i]["total_bytes"] // 10
        assert in_place > 0 and collectives > in_place  # big tensors straight in, small ones packed
    # The survivor kept its optimizer tensors (overwritten in place, not rebuilt)...
    assert r[1]["stats"][1:3] == (0, True) and r[1]["same_tensors"]
    # ...the new rank created exactly its own Adam state (exp_avg, exp_avg_sq, step per parameter).
    assert r[2]["stats"][1:3] == (r[2]["own_optimizer_bytes"], False)


def test_chunks_cover_every_element_once():
    from elastic_tasks.rank.state.chunked import _pieces

    tensors = [torch.zeros(n) for n in (3, 10, 1, 7)]
    chunks = list(_pieces(tensors, 4))
    assert all(sum(b - a for _, a, b in c) <= 4 for c in chunks)
    covered = {id(t): [] for t in tensors}
    for c in chunks:
        for t, a, b in c:
            covered[id(t)].extend(range(a, b))
    assert all(covered[id(t)] == list(range(t.numel())) for t in tensors)
