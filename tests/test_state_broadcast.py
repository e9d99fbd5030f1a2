"""State replication between real processes (gloo): Adam, AdamW and SGD-momentum state, the fp16
GradScaler and the RNG reach a rank that joins with an empty optimizer, tensor for tensor."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from elastic_tasks.devices import process_group_backend
from elastic_tasks.rank.scaling import LRRamp
from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta
from tests.gloo_pair import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
}
GPU_OPTIMIZERS = ["adam", "adamw"]


def _worker(rank: int, init: str, optimizers: list[str], device: str, backend: str, out: str) -> None:
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=2)
    try:
        for optimizer in optimizers:  # each from fresh state, as if its pair of processes were its own
            _broadcast_one(rank, optimizer, device, f"{out}/{optimizer}-{rank}.pt")
    finally:
        dist.destroy_process_group()


def _broadcast_one(rank: int, optimizer: str, device: str, out: str) -> None:
    torch.manual_seed(rank)  # different initial weights: only the broadcast makes them equal
    dev = torch.device(device, rank) if device == "cuda" else torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to(dev)
    opt = OPTIMIZERS[optimizer](model.parameters())
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**10)
    meta = TrainMeta(step=0, samples_seen=0, global_batch=8, lr=LRRamp(0.01, 0.01), rng_state=b"")
    state = ElasticState(model, opt, meta, scaler)
    if rank == 0:  # the survivor: three steps of history
        for _ in range(3):
            opt.zero_grad()
            scaler.scale(model(torch.randn(8, 4, device=dev)).pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update(new_scale=scaler.get_scale() * 2)
        state.meta = TrainMeta(step=3, samples_seen=24, global_batch=8, lr=LRRamp(0.01, 0.02, 3, 5), rng_state=b"")
    state.capture_rng()
    state.broadcast(src=0)
    draw = torch.rand(4)  # both ranks continue from the source's RNG state
    opt_state = {i: {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in s.items()} for i, s in enumerate(opt.state.values())}
    devices = sorted({v.device.type for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)})
    torch.save(
        {"model": {k: v.cpu() for k, v in model.state_dict().items()}, "opt": opt_state, "meta": state.meta.step,
         "scale": scaler.get_scale(), "draw": draw, "devices": devices},
        out,
    )


def _run(tmp_path, optimizers: list[str], device: str, backend: str) -> dict[str, tuple[dict, dict]]:
    run_ranks(_worker, (f"file://{tmp_path}/store", optimizers, device, backend, str(tmp_path)), 2)
    return {o: (torch.load(tmp_path / f"{o}-0.pt", weights_only=False), torch.load(tmp_path / f"{o}-1.pt", weights_only=False)) for o in optimizers}


@pytest.fixture(scope="module")
def broadcasts(tmp_path_factory):
    """One pair of processes per device runs every optimizer's broadcast in turn; each test reads
    its own. A pair per test spent most of its CPU starting two processes that import torch."""
    runs: dict[tuple[str, str], dict[str, tuple[dict, dict]]] = {}

    def get(optimizer: str, optimizers: list[str], device: str, backend: str) -> tuple[dict, dict]:
        if (device, backend) not in runs:
            runs[device, backend] = _run(tmp_path_factory.mktemp(f"broadcast-{device}"), optimizers, device, backend)
        return runs[device, backend][optimizer]

    return get


def _assert_same(a: dict, b: dict) -> None:
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["opt"].keys() == b["opt"].keys() and len(a["opt"]) > 0
    for i in a["opt"]:
        assert a["opt"][i].keys() == b["opt"][i].keys()
        for key, value in a["opt"][i].items():
            assert torch.equal(value, b["opt"][i][key]), (i, key)
    assert a["meta"] == b["meta"] == 3
    assert a["scale"] == b["scale"] == 2.0**13
    assert torch.equal(a["draw"], b["draw"])
    assert a["devices"] == b["devices"]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_joiner_with_empty_optimizer_receives_the_survivors_state(broadcasts, optimizer):
    a, b = broadcasts(optimizer, sorted(OPTIMIZERS), "cpu", "gloo")
    _assert_same(a, b)
    if optimizer != "sgd":
        assert "step" in a["opt"][0]  # the CPU scalar that made mixed-device buckets necessary


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (nccl allows one rank per GPU); this machine has none")
@pytest.mark.parametrize("optimizer", GPU_OPTIMIZERS)
def test_adam_state_on_gpus_travels_over_a_cpu_gloo_cuda_nccl_group(broadcasts, optimizer):
    # Each rank its own GPU: exp_avg on cuda, Adam's step on the CPU: two buckets, two backends.
    a, b = broadcasts(optimizer, GPU_OPTIMIZERS, "cuda", process_group_backend("nccl"))
    _assert_same(a, b)
    assert a["devices"] == ["cpu", "cuda"]
