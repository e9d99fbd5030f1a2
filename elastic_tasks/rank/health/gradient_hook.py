"""The trainer's DDP communication hook: the gradient allreduce, as a future the control plane can fail.

DDP's reducer waits for the hook's future before ``backward()`` returns. On gloo that future is
a proxy (``abandon.DataPlaneWaits.guard``): a peer that answers nothing no longer holds the rank
in ``backward()`` until gloo's own timeout; the ``HangWatch`` fails the proxy once the control
plane says the generation lost a member. On nccl the future is the collective's own (a CUDA
future, complete at enqueue); the communicator abort frees it.

The hook tells the ``HookWitness`` of its failures itself (raised at once, or when its future
fails), so the error that surfaces from ``backward()`` is told from an autograd error of the
recipe's own (``collective.py``). ``HookWitness.wrap`` would do the same around any hook, at
the price of a second future and a second Python callback on gloo's thread for every bucket of
every step (~10 µs each, issue 34).
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from elastic_tasks.rank.health.abandon import DataPlaneWaits
from elastic_tasks.rank.health.collective import CollectiveFailure, HookWitness


def install(ddp: DistributedDataParallel, waits: DataPlaneWaits, witness: HookWitness) -> None:
    """Register the hook on a new DDP wrapper: each bucket summed over the ranks, one async allreduce.

    A SUM, not a mean: the trainer scales each rank's loss by its share of the global batch
    before backward (``local samples / global batch``), so the sum is the global mean gradient
    whatever the split. DDP's own hook divides while copying into the bucket; a hook gets the
    plain copy, so dividing here would be one more pass over every gradient (issue 34).

    Once the hang watch aborted the group in effect (``witness.aborted``), the hook fails at once
    instead of calling into the aborted group, which DDP still holds.

    A group of one keeps DDP's own C++ hook: its fused copy divides by a world size of 1, so
    the sum is the same, and there is no peer that could leave the allreduce hanging or fail
    it. The Python hook cost that rank, every step, a call into Python from the reducer and a
    ``then`` callback on gloo's thread, which has no Python thread state of its own (strace:
    +2.7 futex and +0.6 gettid calls a step): 70-90 µs of process CPU a step on mlp_tiny, a
    third of it on the training thread (measured A/B in one process; issue 34). An abort
    there still ends the step's data-plane region in ``CollectiveFailure``
    (``hang_watch._DataPlane``); on gloo, an allreduce of an aborted group of one completes.
    """
    group = ddp.process_group
    if group.size() == 1:
        return

    def first(fut: torch.futures.Future) -> torch.Tensor:
        try:
            return fut.value()[0]
        except Exception as exc:
            witness.saw(exc)
            raise

    # Unannotated, with DDP's parameter names: DDP inspects a hook's signature.
    def hook(state, bucket):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        try:
            if witness.aborted():
                raise CollectiveFailure("gradient allreduce: the group was aborted")
            tensor = bucket.buffer()
            # The group's own allreduce (a SUM by default): ``dist.all_reduce``'s Python wrapper
            # (argument checks, logging) cost ~15 µs a bucket on a busy host, for a real tensor
            # of DDP's own bucket that needs none of it.
            fut = group.allreduce([tensor]).get_future()
        except Exception as exc:
            witness.saw(exc)
            raise
        if tensor.device.type == "cuda":
            return fut.then(first)
        return waits.guard(fut, first=True, on_error=witness.saw)

    ddp.register_comm_hook(None, hook)
