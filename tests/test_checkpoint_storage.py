"""Checkpoints on shared storage through fsspec: a local path, a ``file://`` URL (a mounted
volume), and an in-memory filesystem standing for an object store (``s3://`` goes the same way)."""

from __future__ import annotations

import uuid

import fsspec
import pytest
import torch

from elastic_tasks.rank.scaling import LRRamp
from elastic_tasks.rank.state.elastic import CHECKPOINT_NAME, META_NAME, ElasticState, TrainMeta, has_checkpoint, read_meta


def _trained_state(seed: int, steps: int) -> ElasticState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    state = ElasticState(model, opt, TrainMeta(step=0, samples_seen=0, global_batch=8, lr=LRRamp(0.01, 0.01), rng_state=b""))
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,))).backward()
        opt.step()
    state.meta = TrainMeta(step=steps, samples_seen=8 * steps, global_batch=8, lr=LRRamp(0.01, 0.02, steps, 10), rng_state=b"")
    return state


def _assert_same(a: ElasticState, b: ElasticState) -> None:
    for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()):
        assert torch.equal(x, y)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a.optimizer.state[p][key], b.optimizer.state[q][key])
    assert b.meta.step == a.meta.step and b.meta.lr == a.meta.lr


@pytest.mark.parametrize("kind", ["path", "file-url", "memory"])
def test_round_trip_through_each_filesystem(tmp_path, kind):
    where = {
        "path": str(tmp_path / "ckpt"),
        "file-url": f"file://{tmp_path / 'volume' / 'ckpt'}",
        "memory": f"memory://malleable-{uuid.uuid4().hex}/run-1/job-a",
    }[kind]
    saved = _trained_state(0, steps=3)
    torch.manual_seed(7)
    saved.save(where)
    draw_after_save = torch.rand(2)

    assert has_checkpoint(where) and read_meta(where).step == 3
    fs, root = fsspec.core.url_to_fs(where)
    assert fs.ls(root, detail=False) and sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)) == sorted([CHECKPOINT_NAME, META_NAME])  # no temp left

    loaded = _trained_state(1, steps=0)  # another rank: different weights, no optimizer state yet
    loaded.load(where)
    _assert_same(saved, loaded)
    assert torch.equal(torch.rand(2), draw_after_save)  # the RNG resumes where the saver's was

    # A newer checkpoint replaces the old one whole.
    newer = _trained_state(0, steps=5)
    newer.save(where)
    assert read_meta(where).step == 5


def test_missing_checkpoint_is_named(tmp_path):
    state = _trained_state(0, steps=0)
    for where in (str(tmp_path / "nothing"), f"memory://malleable-{uuid.uuid4().hex}/nothing"):
        assert not has_checkpoint(where)
        with pytest.raises(FileNotFoundError, match="checkpoint_dir="):
            state.load(where)
    assert not has_checkpoint(None)


def test_checkpoint_setting_takes_a_path_or_a_url(tmp_path, monkeypatch):
    from pathlib import Path

    from flows.config.settings import SettingsError, load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MALLEABLE_CHECKPOINT_DIR", raising=False)
    monkeypatch.delenv("MALLEABLE_STATE_DIR", raising=False)
    assert load_settings().checkpoint_location("run-1") == str(tmp_path.resolve() / ".malleable" / "checkpoints" / "run-1")
    monkeypatch.setenv("MALLEABLE_CHECKPOINT_DIR", "/mnt/shared/ckpt")
    assert load_settings().checkpoint_location("run-1") == str(Path("/mnt/shared/ckpt").resolve() / "run-1")
    monkeypatch.setenv("MALLEABLE_CHECKPOINT_DIR", "s3://bucket/malleable/")
    settings = load_settings()
    assert settings.checkpoint_location("run-1") == "s3://bucket/malleable/run-1"
    with pytest.raises(SettingsError, match="MALLEABLE_CHECKPOINT_DIR='s3://bucket/malleable/'"):
        settings.resolved_checkpoint_dir  # noqa: B018  (hpo's trial files are local)
