"""Issue 22.3/22.6: the checkpoint's metadata is read without loading its tensors."""

import os

import torch
from torch import nn

from elastic_tasks.rank.scaling import LRRamp
from elastic_tasks.rank.state.elastic import CHECKPOINT_NAME, META_NAME, ElasticState, TrainMeta, read_meta


def _state(step: int, finished: bool) -> ElasticState:
    model = nn.Linear(4, 2)
    meta = TrainMeta(step=step, samples_seen=8 * step, global_batch=8, lr=LRRamp(0.1, 0.1), rng_state=b"", finished=finished)
    return ElasticState(model, torch.optim.SGD(model.parameters(), lr=0.1), meta)


def test_finished_flag_comes_from_the_sidecar_not_the_tensors(tmp_path):
    _state(12, True).save(tmp_path)
    assert (tmp_path / META_NAME).stat().st_size < (tmp_path / CHECKPOINT_NAME).stat().st_size
    # Make the tensors unreadable, keeping the checkpoint older than its sidecar: a reader that
    # loaded the tensors would fail here.
    ckpt = tmp_path / CHECKPOINT_NAME
    ckpt.write_bytes(b"not a checkpoint")
    sidecar_time = (tmp_path / META_NAME).stat().st_mtime
    os.utime(ckpt, (sidecar_time - 10, sidecar_time - 10))
    meta = read_meta(tmp_path)
    assert (meta.step, meta.samples_seen, meta.finished) == (12, 96, True)


def test_a_stale_sidecar_is_not_trusted(tmp_path):
    _state(3, False).save(tmp_path)
    stale = (tmp_path / META_NAME).read_bytes()
    _state(9, True).save(tmp_path)
    (tmp_path / META_NAME).write_bytes(stale)  # a crash between the two writes, seen as an old sidecar
    ckpt_time = (tmp_path / CHECKPOINT_NAME).stat().st_mtime
    os.utime(tmp_path / META_NAME, (ckpt_time - 10, ckpt_time - 10))
    meta = read_meta(tmp_path)
    assert (meta.step, meta.finished) == (9, True)


def test_a_checkpoint_without_sidecar_still_reads(tmp_path):
    _state(4, False).save(tmp_path)
    (tmp_path / META_NAME).unlink()
    assert read_meta(tmp_path).step == 4
    state = _state(0, False)
    state.load(tmp_path)  # memory-mapped load
    assert state.meta.step == 4
