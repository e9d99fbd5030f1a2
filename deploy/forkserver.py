"""Training workers forked from one server process that imported torch once, not spawned afresh.

A spawned worker imports distributed, torch and the rank code from nothing: 4-5 CPU-s and
several seconds of wall each, at every cluster start and at every nanny restart. multiprocessing's
forkserver imports them once per calling process and forks each worker from there. Measured on
the 2-core box (two workers, torch imported on each): a cluster after the first started in
0.3 CPU-s and 1.2 s, against 5-6 CPU-s and 10-15 s spawned. Fork-safe: the server never runs a
torch op nor touches CUDA (torch's own advice for CUDA with multiprocessing).

What a forked worker would not get right is its environment: the server keeps the one it
started with, so a variable the caller set or removed since (a fault-injection flag of a test
that ended, a secret concealed later) would be wrong in the worker. ``ExactEnvironWorker`` sets
the environment to what a spawned child would have started with, before the worker starts.
What the server fixed at its own start stays: the C library's settings read at process start
(``MALLOC_*``, set by the nanny before the first worker starts the server) and the hash seed.
"""

from __future__ import annotations

import multiprocessing
import os
import threading

import dask
import distributed.utils
from distributed import Worker

# What every training worker imports: loaded once in the server. A module missing here is
# skipped by the server (multiprocessing ignores an ImportError in a preload). torch._dynamo is
# what a rank's first optimizer imports (elastic_tasks.cluster.warm_up): 1.3 CPU-s per worker
# otherwise; it starts no thread at import. Measured, 3 workers started and warmed up on the
# loaded 2-core box: 10.4 -> 6.0 CPU-s, 18 -> 13 s.
PRELOAD = ("distributed", "numpy", "torch", "torch.distributed", "elastic_tasks.rank.trainer", "torch._dynamo")
FORKSERVER = {"distributed.worker.multiprocessing-method": "forkserver"}

_preload_lock = threading.Lock()


def preloaded_forkserver() -> multiprocessing.context.ForkServerContext:
    """multiprocessing's forkserver context with the training imports preloaded.

    The preload takes effect where the server has not started yet in this process; where it
    has (started by other code first), workers still fork from it and import what it lacks.
    """
    with _preload_lock, dask.config.set(FORKSERVER):
        ctx = distributed.utils.get_mp_context()  # sets distributed's own preload once; ours replaces it
        ctx.set_forkserver_preload(list(PRELOAD))
    return ctx  # type: ignore[return-value]


class ExactEnvironWorker(Worker):
    """A worker whose process environment is ``environ``, exactly, before it starts.

    The nanny's child applies its ``env`` with ``os.environ.update`` only: on top of the fork
    server's environment that would keep variables removed since the server started.
    """

    def __init__(self, *args: object, environ: dict[str, str], **kwargs: object) -> None:
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)
        super().__init__(*args, **kwargs)
