"""Scalars computed on the device during a step, read on the host without stalling the step.

Reading a CUDA tensor's value (``float(t)``, ``.item()``) waits for every kernel queued
before it, so a read per micro-batch (the loss) or per step (the probe's norms) makes the
host wait for the GPU and kills the overlap of the next step's launches with this step's
kernels. ``Deferred`` copies the values to pinned host memory asynchronously and records a
CUDA event; ``ready()`` asks the event without waiting, and the caller reads a step later,
when the event has long completed. On the CPU the values are simply there: ``ready()`` is
true at once and reading costs nothing.
"""

from __future__ import annotations

import torch


class Deferred:
    """A handful of device scalars (one tensor) on their way to the host."""

    _host: torch.Tensor | tuple[torch.Tensor | float, ...]  # a tuple: ``on_host``'s scalars

    def __init__(self, values: torch.Tensor) -> None:
        if values.requires_grad:
            values = values.detach()
        if values.device.type == "cuda":
            self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._event: torch.cuda.Event | None = torch.cuda.Event()
            self._event.record()
        else:
            self._host, self._event = values, None

    @classmethod
    def on_host(cls, *scalars: torch.Tensor | float) -> Deferred:
        """Host scalars (CPU tensors or floats), read as they are: nothing to copy or wait for, and
        no ``stack`` to make one tensor of them (a kernel's worth of host time every step)."""
        deferred = cls.__new__(cls)
        deferred._host, deferred._event = scalars, None
        return deferred

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def values(self) -> list[float]:
        """The values; waits only if the copy has not completed (callers ask ``ready()`` first)."""
        if self._event is not None:
            self._event.synchronize()
        host = self._host
        if isinstance(host, tuple):  # ``on_host``
            return list(map(float, host))
        return (host if host.dim() == 1 else host.reshape(-1)).tolist()
