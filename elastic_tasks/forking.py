"""Processes forked from multiprocessing's fork server with chosen modules preloaded.

A spawned process imports torch from nothing: ~2 s and ~4 CPU-s on the 2-core box, every time.
The fork server is one process per caller that imports its preload once; each process after that
forks from it in well under a second. The server is the caller's one (deploy/forkserver.py
preloads the training workers' imports there): a preload asked for here is added to what it
already preloads, never put in its place, and where the server already runs, processes fork from
it as it is. It never touches CUDA (importing torch does not initialise it), so a forked rank may
still choose its GPU.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
from collections.abc import Sequence


def forkserver_context(preload: Sequence[str]) -> multiprocessing.context.ForkServerContext:
    """The fork server's context, with ``preload`` added to the modules it imports at its start."""
    ctx = multiprocessing.get_context("forkserver")
    # multiprocessing offers no reader of the preload list: its one server's own attribute.
    current = list(getattr(multiprocessing.forkserver._forkserver, "_preload_modules", ()))
    ctx.set_forkserver_preload(list(dict.fromkeys([*current, *preload])))
    return ctx  # type: ignore[return-value]
