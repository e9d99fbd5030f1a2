"""The state of an elastic job, replicated from a survivor over the network or saved to disk.

``ElasticState`` is what a rank must hold to take the next step identically to every other
rank: model tensors (parameters and buffers), optimizer state, the step counter, the
position in the sample stream, the LR ramp, the RNG state and the recipe's LR scheduler.

Broadcast (seed 002's IO-free replication) goes in two phases so that every rank agrees on
the exact list and shapes of the tensors before any tensor moves: the source sends the
*structure* (metadata, optimizer state with tensors replaced by shape/dtype descriptors) as
one object; receivers whose optimizer state is still empty (new ranks: no momentum yet)
materialise it from the descriptors, while survivors whose optimizer state already has that
structure keep their tensors (no rebuild: the values are overwritten in place); then the
tensors travel per (device, dtype) bucket in bounded chunks, straight into each rank's own
tensors where they can (``elastic_tasks.rank.state.chunked``). Buckets matter on GPUs: Adam
and AdamW keep ``state["step"]`` on the CPU next to ``exp_avg`` on the GPU, so one buffer per
dtype would concatenate across devices; on an nccl job the CPU buckets travel over the gloo
side of a ``cpu:gloo,cuda:nccl`` group (see ``trainer.process_group_backend``).

Checkpoints go through fsspec (a path, a mounted volume, ``s3://``…), one file written by one
rank. torch.distributed.checkpoint is not used: it shines for *sharded* state (FSDP, tensor
parallel), where each rank writes its shard; here every rank holds the whole replicated state,
and DCP's save is a collective over the process group — the checkpoint-restart fallback must
save from whichever rank survives, outside any group, and the RNG and sampler position are not
tensors. One ``torch.save`` payload keeps that path group-free and readable by the flow.
"""

from __future__ import annotations

import dataclasses
import io
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import torch
import torch.distributed as dist
from torch import nn

from elastic_tasks.rank.state.chunked import DEFAULT_CHUNK_BYTES, BroadcastStats, broadcast_object, broadcast_tensors, combine
from elastic_tasks.rank.health.abandon import DataPlaneWaits
from elastic_tasks.rank.scaling import LRRamp

# Where checkpoints lie and whether one is there: torch-free, for the coordinator's side.
from elastic_tasks.rank.state.checkpoint_files import CHECKPOINT_NAME, META_NAME, check_readable, has_checkpoint  # noqa: E402, F401
from elastic_tasks.rank.state.checkpoint_files import filesystem as _filesystem, is_local as _is_local  # noqa: E402


@dataclass(frozen=True, slots=True)
class TrainMeta:
    """Everything but the tensors; identical on every rank after each step."""

    step: int
    samples_seen: int
    global_batch: int
    lr: LRRamp
    rng_state: bytes
    finished: bool = False
    cuda_rng_state: bytes = b""  # the rank's current CUDA device; empty where there is none

    def __post_init__(self) -> None:
        step, seen, batch = self.step, self.samples_seen, self.global_batch  # one test, not a loop: it runs every step
        if isinstance(step, int) and isinstance(seen, int) and isinstance(batch, int) and min(step, seen, batch) >= 0:
            return
        for name in ("step", "samples_seen", "global_batch"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 0):
                raise ValueError(f"TrainMeta.{name}={value!r}: must be an integer >= 0")

    def stepped(self, samples: int) -> TrainMeta:
        """After one more step of ``samples``: ``dataclasses.replace`` without its introspection (every step)."""
        return TrainMeta(self.step + 1, self.samples_seen + samples, self.global_batch, self.lr, self.rng_state, self.finished, self.cuda_rng_state)


@dataclass(frozen=True, slots=True)
class _TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(slots=True)
class ElasticState:
    """A rank's live training state; the model and optimizer are updated in place."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    meta: TrainMeta
    scaler: torch.amp.GradScaler | None = None  # fp16: its scale and growth tracker travel too
    scheduler: Any = None  # the recipe's torch.optim.lr_scheduler: its position and state travel too

    def capture_rng(self) -> None:
        cuda = torch.cuda.get_rng_state().numpy().tobytes() if _cuda_ready() else b""
        self.meta = dataclasses.replace(self.meta, rng_state=torch.get_rng_state().numpy().tobytes(), cuda_rng_state=cuda)

    def restore_rng(self) -> None:
        torch.set_rng_state(torch.frombuffer(bytearray(self.meta.rng_state), dtype=torch.uint8))
        if self.meta.cuda_rng_state and torch.cuda.is_available():
            torch.cuda.set_rng_state(torch.frombuffer(bytearray(self.meta.cuda_rng_state), dtype=torch.uint8))

    def _scaler_state(self) -> dict[str, object] | None:
        return None if self.scaler is None or not self.scaler.is_enabled() else self.scaler.state_dict()

    def _load_scaler(self, state: dict[str, object] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def _scheduler_state(self) -> dict[str, object] | None:
        return None if self.scheduler is None else self.scheduler.state_dict()

    def _load_scheduler(self, state: dict[str, object] | None) -> None:
        if self.scheduler is not None and state is not None:
            self.scheduler.load_state_dict(state)

    # -- broadcast -----------------------------------------------------------------------

    def broadcast(
        self, src: int, group: dist.ProcessGroup | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES, waits: DataPlaneWaits | None = None
    ) -> BroadcastStats:
        """Make every rank's state equal to rank ``src``'s (collective: all ranks call it).

        Extra memory per rank: one staging buffer of at most ``chunk_bytes``, plus, on a rank
        with no optimizer state yet (a new rank), that state itself. ``waits``: the hang
        watch's, which frees the rank from a broadcast a lost peer never completes.
        """
        is_src = dist.get_rank(group) == src
        if is_src:
            self.capture_rng()
        structure = (self.meta, _describe(self.optimizer.state_dict()), self._scaler_state(), self._scheduler_state()) if is_src else None
        meta, opt_structure, scaler_state, scheduler_state = broadcast_object(structure, src, is_src, group, waits)  # type: ignore[misc]
        kept, materialised = True, 0
        if not is_src:
            # A survivor's optimizer state already has the source's structure: its tensors are
            # overwritten in place below. A new rank's is empty: load_state_dict puts each
            # materialised tensor where the optimizer keeps it (exp_avg next to its parameter,
            # Adam's step on the CPU), as on the source.
            if _describe(self.optimizer.state_dict()) != opt_structure:
                fresh = _materialise(opt_structure)
                self.optimizer.load_state_dict(fresh)
                kept, materialised = False, _nbytes(fresh)
            self.meta = meta
            self.restore_rng()
            self._load_scaler(scaler_state)
            self._load_scheduler(scheduler_state)
        parts = [broadcast_tensors(bucket, src, is_src, chunk_bytes, group, waits) for bucket in buckets(self._tensors())]
        return combine(parts, materialised, kept)

    def _tensors(self) -> Iterator[torch.Tensor]:
        """Model then optimizer tensors in an order every rank derives the same way."""
        yield from self.model.state_dict(keep_vars=True).values()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for p in params:
            state = self.optimizer.state.get(p, {})
            for key in sorted(state):
                if isinstance(state[key], torch.Tensor):
                    yield state[key]

    # -- disk ------------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike[str], guard: CommitGuard | None = None) -> Path | str:
        """Write atomically (``write_checkpoint``); the step loop saves through ``rank/state/checkpoint_writer.py`` instead."""
        return write_checkpoint(directory, self.snapshot(), guard)

    def snapshot(self) -> dict[str, object]:
        """The checkpoint payload, every tensor copied to host memory: later steps may change the live ones."""
        self.capture_rng()
        payload: dict[str, object] = {
            "model": _to_host(self.model.state_dict()),
            "optimizer": _to_host(self.optimizer.state_dict()),
            "meta": _meta_to_dict(self.meta),
        }
        if (scaler_state := self._scaler_state()) is not None:
            payload["scaler"] = _to_host(scaler_state)
        if (scheduler_state := self._scheduler_state()) is not None:
            payload["scheduler"] = _to_host(scheduler_state)
        return payload

    def load(self, directory: str | os.PathLike[str]) -> None:
        if not has_checkpoint(directory):
            raise FileNotFoundError(f"checkpoint_dir={str(directory)!r}: no {CHECKPOINT_NAME} there")
        payload = read_checkpoint(directory)
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.meta = _meta_from_dict(payload["meta"])
        self.restore_rng()
        self._load_scaler(payload.get("scaler"))
        self._load_scheduler(payload.get("scheduler"))


@dataclass(frozen=True, slots=True)
class CommitGuard:
    """Who writes a checkpoint (stamped into it as ``payload["writer"]``) and the check that it
    still may: ``confirm`` raises (``board.Fenced``) once the coordinator declared the rank lost,
    so a rank that comes back after its job went on never replaces the survivors' checkpoint."""

    uid: str
    generation: Callable[[], int]
    confirm: Callable[[], None]

    def stamp(self) -> dict[str, object]:
        return {"uid": self.uid, "generation": int(self.generation())}


def write_checkpoint(directory: str | os.PathLike[str], payload: dict[str, object], guard: CommitGuard | None = None) -> Path | str:
    """Write a ``snapshot()`` atomically: a crash (or a reader on another pod) never sees half a checkpoint.

    ``directory`` is a local path (a mounted volume included) or an fsspec URL
    (``s3://bucket/run``, ``memory://…``), so a rank on another pod and the flow can read
    what this rank wrote. Local: temp files, fsync, then ``guard.confirm()``, then rename.
    Elsewhere: ``guard.confirm()``, then one whole-object write, which object stores make
    visible all at once (they have no rename). A refused confirm leaves the last checkpoint as it was.
    """
    if guard is not None:
        payload = {**payload, "writer": guard.stamp()}
    fs, root = _filesystem(directory)
    # The metadata sidecar is written second: read_meta trusts it only when it is the newer file.
    if not _is_local(fs):
        if guard is not None:
            guard.confirm()
        fs.makedirs(root, exist_ok=True)
        target = f"{root}/{CHECKPOINT_NAME}"
        _pipe(fs, target, payload)
        _pipe(fs, f"{root}/{META_NAME}", payload["meta"])
        return _unstrip(directory, fs, target)
    local = Path(root)
    local.mkdir(parents=True, exist_ok=True)
    staged = [(_stage_local(local, CHECKPOINT_NAME, payload), CHECKPOINT_NAME)]
    try:
        staged.append((_stage_local(local, META_NAME, payload["meta"]), META_NAME))
        if guard is not None:
            guard.confirm()  # the slow part (serialise, fsync) is done: the check is as late as it can be
        for tmp, name in staged:
            os.replace(tmp, local / name)
    finally:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
    return local / CHECKPOINT_NAME


def _to_host(obj: object) -> object:
    """A deep copy whose tensors live in host memory (a state_dict's tensors alias the live ones)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_host(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_host(v) for v in obj)
    return obj


def buckets(tensors: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Tensors grouped by (device, dtype), in an order every rank derives the same way.

    Within a bucket the input order is kept; buckets are sorted by their key's text, so two
    ranks holding the same tensors on the same kinds of device send and receive identically.
    """
    grouped: dict[tuple[str, str], list[torch.Tensor]] = {}
    for t in tensors:
        grouped.setdefault((str(t.device), str(t.dtype)), []).append(t)
    return [grouped[key] for key in sorted(grouped)]


def _cuda_ready() -> bool:
    # Reading the CUDA RNG initialises CUDA; a process that never touched it has nothing to carry.
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _unstrip(directory: str | os.PathLike[str], fs: fsspec.AbstractFileSystem, path: str) -> str:
    return fs.unstrip_protocol(path) if "://" in os.fspath(directory) else path


def read_checkpoint(directory: str | os.PathLike[str]) -> dict:
    """The saved payload (``model``, ``optimizer``, ``meta``) from a path or fsspec URL.

    A local file is memory-mapped (``mmap=True``): the tensors are read from the page cache as
    they are copied into the model, not held a second time in a bytes object of the whole file.
    """
    fs, root = _filesystem(directory)
    if _is_local(fs):
        return torch.load(f"{root}/{CHECKPOINT_NAME}", map_location="cpu", weights_only=True, mmap=True)
    with fs.open(f"{root}/{CHECKPOINT_NAME}", "rb") as f:
        return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)


def _pipe(fs: fsspec.AbstractFileSystem, path: str, obj: object) -> None:
    """One whole-object write: object stores make it visible all at once."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    fs.pipe_file(path, buffer.getvalue())


def _stage_local(local: Path, name: str, obj: object) -> str:
    """``obj`` in a temp file beside ``name``, fsynced (the caller renames it over ``name``, or
    removes it): a crash never leaves half of ``name``."""
    fd, tmp = tempfile.mkstemp(dir=local, prefix=f".{Path(name).stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def read_meta(directory: str | os.PathLike[str]) -> TrainMeta:
    """The checkpoint's metadata (step, ``finished``...) without loading its tensors: from the
    sidecar when it matches the checkpoint, else (a checkpoint from before the sidecar, or a
    crash between the two writes) from the checkpoint itself."""
    fs, root = _filesystem(directory)
    sidecar = f"{root}/{META_NAME}"
    if fs.isfile(sidecar):
        with fs.open(sidecar, "rb") as f:
            meta = _meta_from_dict(torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True))
        if _sidecar_current(fs, root):
            return meta
    return _meta_from_dict(read_checkpoint(directory)["meta"])


def _sidecar_current(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    """The sidecar was written after the checkpoint it describes (it is written second)."""
    try:
        return float(fs.modified(f"{root}/{META_NAME}").timestamp()) >= float(fs.modified(f"{root}/{CHECKPOINT_NAME}").timestamp())
    except (NotImplementedError, OSError, AttributeError):
        return False  # a store without modification times: read the checkpoint itself


def _nbytes(obj: object) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, list):
        return sum(_nbytes(v) for v in obj)
    return 0


def _describe(obj: object) -> object:
    if isinstance(obj, torch.Tensor):
        return _TensorSpec(tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _describe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_describe(v) for v in obj]
    return obj


def _materialise(obj: object) -> object:
    if isinstance(obj, _TensorSpec):
        return torch.zeros(obj.shape, dtype=obj.dtype)
    if isinstance(obj, dict):
        return {k: _materialise(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_materialise(v) for v in obj]
    return obj


def _meta_to_dict(meta: TrainMeta) -> dict[str, object]:
    # torch.load(weights_only=True) accepts plain containers only; the dataclass is rebuilt on load.
    return {
        "step": meta.step,
        "samples_seen": meta.samples_seen,
        "global_batch": meta.global_batch,
        "lr": [meta.lr.start, meta.lr.target, meta.lr.begin, meta.lr.steps],
        "rng_state": torch.frombuffer(bytearray(meta.rng_state), dtype=torch.uint8).clone(),
        "finished": meta.finished,
        "cuda_rng_state": torch.tensor(list(meta.cuda_rng_state), dtype=torch.uint8),
    }


def _meta_from_dict(d: dict[str, object]) -> TrainMeta:
    start, target, begin, steps = d["lr"]  # type: ignore[misc]
    return TrainMeta(
        step=int(d["step"]),  # type: ignore[arg-type]
        samples_seen=int(d["samples_seen"]),  # type: ignore[arg-type]
        global_batch=int(d["global_batch"]),  # type: ignore[arg-type]
        lr=LRRamp(float(start), float(target), int(begin), int(steps)),
        rng_state=d["rng_state"].numpy().tobytes(),  # type: ignore[union-attr]
        finished=bool(d["finished"]),
        cuda_rng_state=d["cuda_rng_state"].numpy().tobytes() if "cuda_rng_state" in d else b"",  # type: ignore[union-attr]
    )
