"""The rank's DistributedDataParallel wrapper, built the same way on every torch we meet.

torch 2.13 renamed ``broadcast_buffers`` to ``forward_sync_buffers`` (the old name is deprecated
there); the GPU images teams run still carry older releases (2.11 on the lent H200 raised
``TypeError`` on the new name), so the keyword is chosen by what the installed DDP accepts.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection

import torch
from torch.nn.parallel import DistributedDataParallel


def no_forward_buffer_sync(accepted: Collection[str]) -> dict[str, bool]:
    """The keyword that turns off DDP's buffer broadcast before each forward, for a DDP whose
    ``__init__`` accepts the parameter names ``accepted``."""
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in accepted else {"broadcast_buffers": False}


_NO_BUFFER_SYNC = no_forward_buffer_sync(inspect.signature(DistributedDataParallel.__init__).parameters)


def rank_ddp(module: torch.nn.Module) -> DistributedDataParallel:
    """``module`` under DDP as a rank trains it: no set-up sync (the state was already agreed:
    loaded, or broadcast from a survivor) and no per-forward buffer broadcast."""
    return DistributedDataParallel(module, init_sync=False, **_NO_BUFFER_SYNC)
