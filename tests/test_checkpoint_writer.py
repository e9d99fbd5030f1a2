"""Rank 0's checkpoints written in the background: a snapshot of the step it was taken at, in
order, and never a torn 'latest' when a write dies half-way."""

import dataclasses

import pytest
import torch

from elastic_tasks.rank.state.checkpoint_writer import CheckpointWriter
from elastic_tasks.rank.scaling import LRRamp
from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta, read_checkpoint, read_meta


def _state() -> ElasticState:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return ElasticState(model, opt, TrainMeta(step=0, samples_seen=0, global_batch=8, lr=LRRamp(0.01, 0.01), rng_state=b""))


def _train_one_step(state: ElasticState) -> None:
    state.optimizer.zero_grad()
    state.model(torch.randn(8, 64)).pow(2).sum().backward()
    state.optimizer.step()
    state.meta = dataclasses.replace(state.meta, step=state.meta.step + 1)


def test_a_background_save_holds_the_state_of_the_step_it_was_taken_at(tmp_path):
    state, writer = _state(), CheckpointWriter()
    _train_one_step(state)
    expected = {k: v.clone() for k, v in state.model.state_dict().items()}
    writer.save(state, tmp_path)
    for _ in range(3):  # the loop goes on while the write runs: the snapshot must not follow it
        _train_one_step(state)
    writer.wait()
    saved = read_checkpoint(tmp_path)
    assert saved["meta"]["step"] == 1
    for key, value in expected.items():
        assert torch.equal(saved["model"][key], value)
    assert not torch.equal(saved["model"]["weight"], state.model.weight.detach())
    writer.save(state, tmp_path)  # the next save waits for the last: they land in order
    writer.save(state, tmp_path)
    writer.wait()
    assert read_checkpoint(tmp_path)["meta"]["step"] == 4 and writer.written == 3


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("disk full")  # fails half-way through torch.save's stream


def test_a_write_that_dies_half_way_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    state, writer = _state(), CheckpointWriter()
    writer.save(state, tmp_path)
    writer.wait()
    before = (tmp_path / "state.pt").read_bytes()
    _train_one_step(state)
    original = ElasticState.snapshot
    monkeypatch.setattr(ElasticState, "snapshot", lambda self: {**original(self), "zz": _Unpicklable()})
    writer.save(state, tmp_path)
    with pytest.raises(RuntimeError, match="disk full"):
        writer.wait()  # the loop hears of it at its next save or wait
    assert (tmp_path / "state.pt").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.pt", "state.pt"]  # no temp file left behind
    assert read_checkpoint(tmp_path)["meta"]["step"] == 0
    assert read_meta(tmp_path).step == 0  # the metadata sidecar still describes the whole checkpoint
