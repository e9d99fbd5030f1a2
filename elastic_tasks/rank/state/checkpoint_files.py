"""Where a job's checkpoint lies (a path or an fsspec URL) and whether one is there, without torch.

The coordinator, the executor and the service ask "is there a checkpoint to resume from?";
answering that needs only fsspec. Kept apart from ``elastic_tasks.rank.state.elastic`` (which loads and
saves the tensors) so that a `malleable serve` process never imports torch for it: the ranks
import torch on the workers (issue 28: the service's start after a crash was mostly imports).
"""

from __future__ import annotations

import os
import zipfile

import fsspec
from fsspec.core import url_to_fs

CHECKPOINT_NAME = "state.pt"
# Next to it: the metadata alone (a few hundred bytes), so reading the ``finished`` flag or the
# step never loads tensors; written before the checkpoint replaces the old one.
META_NAME = "meta.pt"


def filesystem(directory: str | os.PathLike[str]) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and in-filesystem path of a checkpoint directory (path or URL)."""
    fs, root = url_to_fs(os.fspath(directory))
    return fs, root.rstrip("/") or "/"


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def check_readable(directory: str | os.PathLike[str]) -> None:
    """Raise if the checkpoint cannot be opened, without reading its tensors: its zip directory,
    which sits at the end of the file, is the first thing a truncated or damaged file loses. (The
    metadata sidecar may still read fine beside a damaged checkpoint.)"""
    fs, root = filesystem(directory)
    if is_local(fs):
        with zipfile.ZipFile(f"{root}/{CHECKPOINT_NAME}"):
            return
    with fs.open(f"{root}/{CHECKPOINT_NAME}", "rb") as f, zipfile.ZipFile(f):
        return


def has_checkpoint(directory: str | os.PathLike[str] | None) -> bool:
    if directory is None:
        return False
    fs, root = filesystem(directory)
    return fs.isfile(f"{root}/{CHECKPOINT_NAME}")
