"""A rank's step records, streamed to a temporary file as they come (issue 34: bounded bookkeeping).

Every step's record goes back to the user (``RankResult.history``: the loss curve, MLflow's
per-step metrics), but kept as Python objects it grew a rank's memory by ~350 B per step,
never trimmed (~0.35 GB per million steps, on every rank). Here each record is packed
(``struct``: ~100 B) into an unnamed temporary file through a fixed-size write buffer, so the
process holds no more per step, and the records are read back once, when the rank returns
its result. The file goes away with the process (``tempfile.TemporaryFile``).
"""

from __future__ import annotations

import io
import math
import struct
import tempfile
from collections.abc import Iterator

from elastic_tasks.protocol import StepRecord

# step, loss, accuracy, world_size, global_batch, lr, wall_s, agree_s, cpu_s, noise_scale, loss_samples, len(group_lrs)
_HEAD = struct.Struct("<qddqqdddddqI")
_NONE = -1  # loss_samples absent
_LR_SIZE = struct.calcsize("<d")


class StepHistory:
    """Append-only records; iterating reads them back in order."""

    def __init__(self) -> None:
        self._file: io.BufferedRandom | None = None
        self._count = 0

    def append(self, r: StepRecord) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the records
        noise = math.nan if r.noise_scale is None else r.noise_scale  # NaN: absent (a measured scale is never NaN)
        loss_samples = _NONE if r.loss_samples is None else r.loss_samples
        lrs = r.group_lrs
        head = _HEAD.pack(r.step, r.loss, r.accuracy, r.world_size, r.global_batch, r.lr, r.wall_s, r.agree_s, r.cpu_s, noise, loss_samples, len(lrs))
        self._file.write(head + struct.pack(f"<{len(lrs)}d", *lrs) if lrs else head)
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[StepRecord]:
        if self._file is None:
            return iter(())
        self._file.flush()
        self._file.seek(0)
        data = self._file.read()
        self._file.seek(0, io.SEEK_END)
        return _unpack(data)


def _unpack(data: bytes) -> Iterator[StepRecord]:
    at = 0
    while at < len(data):
        step, loss, acc, world, batch, lr, wall, agree, cpu, noise, samples, n = _HEAD.unpack_from(data, at)
        at += _HEAD.size
        lrs = struct.unpack_from(f"<{n}d", data, at)
        at += n * _LR_SIZE
        yield StepRecord(
            step, loss, acc, world, batch, lr, wall, agree, cpu,
            noise_scale=None if math.isnan(noise) else noise,
            loss_samples=None if samples == _NONE else samples,
            group_lrs=tuple(lrs),
        )
