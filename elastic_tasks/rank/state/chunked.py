"""Tensors broadcast in bounded chunks, in place where they can be (issue 22.3).

The state broadcast after a rescale used to build one flat buffer per (device, dtype):
``torch.cat`` of every tensor on the source, ``torch.empty`` of the same size on every
receiver — for fp32 Adam about 12 B per parameter of extra memory on every rank, at the very
moment the job grows (~20 GB at 1 B parameters: an OOM). Here:

* a contiguous tensor's elements travel straight into the tensor itself (a slice of its flat
  view is a valid collective buffer): no copy at all, whatever its size;
* runs of small tensors are packed into one staging buffer of at most ``chunk_bytes`` (few
  collectives for many biases and Adam's ``step`` scalars), filled on the source and emptied
  into the tensors on the receivers;

so a rank's extra memory is at most one ``chunk_bytes`` buffer, whatever the model's size.
Every chunk is waited for through the hang watch's ``DataPlaneWaits`` (rank/health/abandon.py),
so a peer that answers nothing frees the rank when the control plane says so, on gloo too.
``BroadcastStats`` counts what was allocated: the memory bound is checked on that count
(tracemalloc does not see torch's allocations; RSS on CPU is too noisy for a bound).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from elastic_tasks.rank.health.abandon import DataPlaneWaits

DEFAULT_CHUNK_BYTES = 256 * 2**20  # TrainConfig.broadcast_chunk_mb's default


@dataclass(frozen=True, slots=True)
class BroadcastStats:
    """What one rank's share of a state broadcast cost it."""

    collectives: int  # broadcasts issued
    in_place: int  # of which went straight into a tensor (no staging buffer)
    peak_buffer_bytes: int  # the largest staging buffer this rank allocated (0: none)
    materialised_bytes: int = 0  # optimizer state a new rank created for itself (its own state)
    kept_optimizer_state: bool = True  # False: the optimizer state was rebuilt from the source's structure


def _pieces(bucket: Sequence[torch.Tensor], per: int) -> Iterator[list[tuple[torch.Tensor, int, int]]]:
    """Chunks of at most ``per`` elements: lists of (tensor, start, stop) over the tensors' flat
    elements, in order (every rank derives the same chunks from the same shapes)."""
    chunk: list[tuple[torch.Tensor, int, int]] = []
    room = per
    for t in bucket:
        start, n = 0, t.numel()
        while start < n:
            take = min(room, n - start)
            chunk.append((t, start, start + take))
            start += take
            room -= take
            if room == 0:
                yield chunk
                chunk, room = [], per
    if chunk:
        yield chunk


def _broadcast(tensor: torch.Tensor, src: int, group: dist.ProcessGroup | None, waits: DataPlaneWaits | None) -> None:
    work = dist.broadcast(tensor, src=src, group=group, async_op=True)
    if waits is None:
        work.wait()
    else:
        waits.wait(work, on_device=tensor.device.type == "cuda")


def broadcast_object(obj: object, src: int, is_src: bool, group: dist.ProcessGroup | None = None, waits: DataPlaneWaits | None = None) -> object:
    """``obj`` of rank ``src`` on every rank (pickled, over the group's CPU side: two broadcasts)."""
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8) if is_src else None
    size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
    _broadcast(size, src, group, waits)
    if payload is None:
        payload = torch.empty(int(size[0]), dtype=torch.uint8)
    _broadcast(payload, src, group, waits)
    return obj if is_src else pickle.loads(payload.numpy().tobytes())


def broadcast_tensors(
    bucket: Sequence[torch.Tensor], src: int, is_src: bool, chunk_bytes: int, group: dist.ProcessGroup | None = None, waits: DataPlaneWaits | None = None
) -> BroadcastStats:
    """Broadcast one (device, dtype) bucket from ``src`` into every rank's own tensors."""
    if not bucket:
        return BroadcastStats(0, 0, 0)
    first = bucket[0]
    per = max(1, chunk_bytes // first.element_size())
    collectives = in_place = peak = 0
    with torch.no_grad():
        for chunk in _pieces(bucket, per):
            collectives += 1
            if len(chunk) == 1 and chunk[0][0].is_contiguous():
                t, a, b = chunk[0]
                _broadcast(t.detach().view(-1)[a:b], src, group, waits)
                in_place += 1
                continue
            size = sum(b - a for _, a, b in chunk)
            buffer = torch.empty(size, dtype=first.dtype, device=first.device)
            peak = max(peak, size * first.element_size())
            offset = 0
            if is_src:
                for t, a, b in chunk:
                    buffer[offset : offset + b - a].copy_(t.detach().reshape(-1)[a:b])
                    offset += b - a
            _broadcast(buffer, src, group, waits)
            if not is_src:
                for t, a, b in chunk:
                    _flat_assign(t, a, b, buffer[offset : offset + b - a])
                    offset += b - a
            del buffer
    return BroadcastStats(collectives, in_place, peak)


def _flat_assign(t: torch.Tensor, a: int, b: int, values: torch.Tensor) -> None:
    if t.is_contiguous():
        t.detach().view(-1)[a:b].copy_(values)
    else:  # rare (a transposed buffer): through a flat copy of this one tensor
        flat = t.detach().reshape(-1).clone()
        flat[a:b].copy_(values)
        t.detach().copy_(flat.view_as(t))


def combine(parts: Sequence[BroadcastStats], materialised_bytes: int, kept: bool) -> BroadcastStats:
    return BroadcastStats(
        sum(p.collectives for p in parts),
        sum(p.in_place for p in parts),
        max((p.peak_buffer_bytes for p in parts), default=0),
        materialised_bytes,
        kept,
    )
