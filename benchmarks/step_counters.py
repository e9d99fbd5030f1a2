"""Counting a training step's work instead of timing it (benchmarks/step_work_bench.py).

On a shared 2-core host a step's CPU time moves ±20 % from one second to the next, so what a
GPU would pay is counted instead, per step, with torch's own interposition points:

* ``OpCounter`` (a ``TorchDispatchMode`` plus a ``TorchFunctionMode``): every aten op the step
  dispatches, on the calling thread (backward on CPU runs there too, and so does DDP's reducer:
  its fused scale-and-copy ``mul.out``, its ``copy_`` into the bucket, its ``c10d`` collective).

  - *kernel-like*: an op that would launch a device kernel: one that reads or writes a
    device tensor (see below), or a factory (``zeros``: its device cannot be told on the CPU,
    so it counts as device work). Not kernel-like: ops on host tensors only (the agreement's
    float64 vector), views and other aliasing results (``view``, ``t``, ``detach``,
    ``select``, ``as_strided``...: their schema returns an alias that is not written),
    allocations without a kernel (``empty*``), profiler markers, ``lift_fresh``; collectives
    are counted apart (``c10d`` namespace, with the bytes of their tensors).
  - *host syncs*: reads that would make the host wait for the device on a GPU. On the CPU
    every tensor is host memory, so device residence is emulated: a tensor is "on the device"
    if it was computed from one that is (the seeds are the model's parameters; the batch and
    the host scalars the trainer builds with ``torch.zeros``/``torch.tensor`` stay host, as
    the agreement's float64 CPU tensor does on a GPU host). A read is ``_local_scalar_dense``
    (``item``, ``float``, ``bool``, ``if t``), ``tolist``, ``numpy``, ``cpu``, or a copy into a
    host tensor — of a device tensor written *in the current step* (a read of an earlier
    step's value, once the current step's kernels are queued, does not idle the device: it
    is counted apart, as a *lagged read*).
  - *gradient-sized passes*: the elements written by kernel-like ops whose result has the
    numel of a parameter or of a DDP bucket, divided by the parameter count: one full pass
    over the gradients (the reducer's copy into its buckets, a ``div_`` over a bucket, the
    optimizer's update) counts 1. Forward and backward make such results too; the difference
    between two loops over the same model is what is meant.

* ``python_calls``: Python function calls (``sys.setprofile``'s ``call`` events, this thread),
  run in a separate pass so that the counter's own Python is not counted.
* ``retained_bytes``: growth of ``tracemalloc``'s traced memory over many steps, after warm-up.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

_NO_KERNEL = {"empty", "empty_strided", "empty_like", "lift_fresh", "set_", "resize_"}
_READS = {"tolist", "numpy", "cpu"}


def _aliasing_view(func: torch._ops.OpOverload) -> bool:
    """Whether ``func`` returns an alias it does not write (a view or metadata: no kernel)."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _written(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors an in-place or out= op writes."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
            out.extend(t for t in tree_leaves(value) if isinstance(t, torch.Tensor))
    return out


@dataclass
class OpCounts:
    torch_ops: int = 0
    kernel_ops: int = 0
    collectives: int = 0
    collective_bytes: int = 0
    host_syncs: int = 0
    lagged_reads: int = 0
    grad_elements: int = 0
    kernels: Counter = field(default_factory=Counter)  # kernel-like op name -> count (``--explain``)


class OpCounter(TorchDispatchMode):
    """Counts a step's ops; ``device_seeds`` are the tensors that live on the device (the parameters)."""

    def __init__(self, device_seeds: list[torch.Tensor], grad_numels: set[int]) -> None:
        super().__init__()
        self.counts = OpCounts()
        self.step = 0  # the step in progress: a read of a value it wrote is a sync
        self._written_at = WeakIdKeyDictionary()  # device tensor -> step that last wrote it
        for t in device_seeds:
            self._written_at[t] = -1
        # Host tensors the step made itself (``torch.zeros``, ``torch.tensor`` with no device
        # input), and their views: a copy of a device value into one is a device-to-host read.
        # Tensors made before counting (DDP's buckets) are neither: a copy into them is device work.
        self._host = WeakIdKeyDictionary()
        self.grad_numels = grad_numels
        self._functions = _ReadCounter(self)

    def __enter__(self):  # noqa: ANN204
        self._functions.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._functions.__exit__(*exc)

    def on_device(self, t: object) -> bool:
        """Tensors the step made are classified as made; those made before counting (parameters,
        optimizer state, DDP's buckets: ``bucket.buffer()``) live on the device."""
        return isinstance(t, torch.Tensor) and t not in self._host

    def read(self, t: torch.Tensor) -> None:
        """A host read of ``t``: a sync if the current step wrote it, else a lagged read."""
        if not self.on_device(t):
            return
        if self._written_at.get(t, -1) >= self.step and not _deferred_read():
            self.counts.host_syncs += 1
        else:
            self.counts.lagged_reads += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        ns, name = func.namespace, func._schema.name.split("::")[-1]
        leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        c = self.counts
        if ns == "profiler":
            return func(*args, **kwargs)
        c.torch_ops += 1
        if ns == "c10d":
            c.collectives += 1
            c.collective_bytes += sum(t.numel() * t.element_size() for t in leaves)
            return func(*args, **kwargs)
        if name in ("lift_fresh", "lift_fresh_copy"):  # ``torch.tensor(...)``: a host constant, made before dispatch
            result = func(*args, **kwargs)
            for t in tree_leaves(result):
                if isinstance(t, torch.Tensor):
                    self._host[t] = True
            return result
        if name == "_local_scalar_dense":
            self.read(args[0])
        elif name == "copy_" and args[0] in self._host and not kwargs.get("non_blocking", False):
            self.read(args[1])  # ``stats[0] = loss``: a blocking device-to-host copy on a GPU
        result = func(*args, **kwargs)
        outputs = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
        device = any(self.on_device(t) for t in leaves)
        # A kernel on a GPU: an op on device tensors, or a factory (on the CPU a factory's device
        # cannot be told: counted as device work, which over-counts the host's own scalars).
        kernel = name not in _NO_KERNEL and not _aliasing_view(func) and name != "_local_scalar_dense" and (device or not leaves)
        if kernel:
            c.kernel_ops += 1
            c.kernels[name] += 1
            c.grad_elements += sum(t.numel() for t in outputs if t.numel() in self.grad_numels)
        if device:
            for t in outputs + _written(func, args, kwargs):
                self._written_at[t] = self.step
        else:  # a host tensor made in the step (no device input), and its views
            for t in outputs:
                self._host[t] = True
        return result


def _deferred_read() -> bool:
    """A read by ``rank/noise/deferred.Deferred.values``: on a GPU it reads pinned host memory its
    callers read only once ``ready()`` (the copy's CUDA event completed); on the CPU ``ready()``
    is true at once, so the same step's value reads here without being a sync there."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == "values" and frame.f_code.co_filename.endswith("deferred.py"):
            return True
        frame = frame.f_back
    return False


class _ReadCounter(TorchFunctionMode):
    """The reads that dispatch no aten op on the CPU (``tolist``, ``numpy``, ``cpu`` of a CPU tensor)."""

    def __init__(self, ops: OpCounter) -> None:
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if getattr(func, "__name__", "") in _READS and args and isinstance(args[0], torch.Tensor):
            self.ops.read(args[0])
        return func(*args, **(kwargs or {}))


def count_ops(step: Callable[[], object], steps: int, device_seeds: list[torch.Tensor], grad_numels: set[int]) -> OpCounts:
    """``step`` run ``steps`` times under an ``OpCounter``; the totals (divide by ``steps``)."""
    counter = OpCounter(device_seeds, grad_numels)
    with counter:
        for i in range(steps):
            counter.step = i
            step()
    return counter.counts


def count_python_calls(step: Callable[[], object], steps: int) -> int:
    """Python function calls on this thread over ``steps`` steps."""
    calls = 0

    def profile(frame, event, arg):  # noqa: ANN001, ANN202
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(profile)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)
    return calls


def retained_bytes(step: Callable[[], object], steps: int) -> float:
    """Traced memory still held after ``steps`` steps, per step (run after warm-up)."""
    tracemalloc.start()
    try:
        for _ in range(steps):  # what the first traced steps allocate once (caches, an epoch's iterator)
            step()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(steps):
            step()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / steps
