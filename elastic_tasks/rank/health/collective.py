"""A failed collective as a type: ``CollectiveFailure``, raised where a torch.distributed call fails.

gloo reports a dead peer as a plain ``RuntimeError`` ("Connection closed by peer ...";
measured with torch 2.13), nccl as ``DistBackendError``, a rendezvous that never opens as
``TimeoutError``: no exception type of torch's says "the group is broken". So the trainer
wraps the places where it calls into the process group, and a failure there *is* a
collective failure, whatever its text. Everything else (a recipe's own error) goes through
untouched and fails the job, as it should.

Two collectives run inside DDP, where the trainer cannot wrap the call itself:

* the gradient allreduce runs in DDP's communication hook; the witness (``HookWitness``)
  records its failure (raised at once, or later by its future) so the error that surfaces
  from ``backward()`` can be told from an autograd error of the recipe;
* DDP's one-off bucket rebuild (a broadcast from rank 0) runs in the forward of a new
  wrapper's second step: its failure is raised from DDP's own frame in torch, which is
  how ``step_collectives`` recognises it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType

import torch
import torch.nn.parallel.distributed as _ddp

# What torch raises when a peer dies, hangs or never shows up (see the module docstring).
_DIST_ERRORS = (RuntimeError, TimeoutError, ConnectionError)
# DDP's own frames: an error raised here during a forward is its bucket rebuild's broadcast.
_DDP_SOURCE = os.path.realpath(_ddp.__file__)


class CollectiveFailure(RuntimeError):
    """A rendezvous or collective of the current generation failed: a peer is gone or hung.

    ``__cause__`` is torch's own exception.
    """


def collective(what: str) -> _Collective:
    """Around calls that only talk to the process group: any failure of theirs is a ``CollectiveFailure``."""
    return _Collective(what)


class _Collective:
    """``collective``'s block: a class, not a generator (the agreement enters two every step)."""

    __slots__ = ("_what",)

    def __init__(self, what: str) -> None:
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None or isinstance(exc, CollectiveFailure) or not isinstance(exc, _DIST_ERRORS):
            return False
        raise CollectiveFailure(f"{self._what}: {type(exc).__name__}: {exc}") from exc


class HookWitness:
    """Sees DDP's gradient allreduce fail inside its communication hook.

    ``aborted`` says whether the hang watch aborted the group in effect: then the hook fails at
    once instead of calling into the aborted group, which DDP still holds (measured, torch 2.13,
    gloo: an allreduce on an aborted group waited until the peer's sockets closed).
    """

    def __init__(self, aborted: Callable[[], bool] = lambda: False) -> None:
        self.error: BaseException | None = None
        self.aborted = aborted
        self._step = _StepCollectives(self, "")  # one block, re-aimed for each micro-batch (not re-entered while open)

    def saw(self, exc: BaseException) -> None:
        """The gradient allreduce failed with ``exc`` (a hook that reports its own failures calls this)."""
        self.error = exc

    def wrap(self, hook: Callable[..., torch.futures.Future]) -> Callable[..., torch.futures.Future]:
        """``hook`` watched: its failures, raised at once or later by its future, are recorded."""
        # Unannotated, with DDP's parameter names: DDP inspects a hook's signature.
        def watched(state, bucket):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
            try:
                if self.aborted():
                    raise CollectiveFailure("gradient allreduce: the group was aborted")
                future = hook(state, bucket)
            except Exception as exc:
                self.error = exc
                raise
            return future.then(self._check)

        return watched

    def _check(self, future: torch.futures.Future) -> torch.Tensor:
        try:
            return future.value()
        except Exception as exc:
            self.error = exc
            raise

    def step_collectives(self, what: str) -> _StepCollectives:
        """Around one step's forward and backward through DDP (the recipe's code runs inside too)."""
        self.error = None
        block = self._step
        block._what = what
        return block


class _StepCollectives:
    """``step_collectives``' block: a class, not a generator (it runs every micro-batch)."""

    __slots__ = ("_witness", "_what")

    def __init__(self, witness: HookWitness, what: str) -> None:
        self._witness, self._what = witness, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None or isinstance(exc, CollectiveFailure) or not isinstance(exc, _DIST_ERRORS):
            return False
        if self._witness.error is None and not _raised_in_ddp(tb):
            return False  # the recipe's own error
        raise CollectiveFailure(f"{self._what}: {type(exc).__name__}: {exc}") from exc


def _raised_in_ddp(tb: TracebackType | None) -> bool:
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and os.path.realpath(last.tb_frame.f_code.co_filename) == _DDP_SOURCE

