"""Real gloo ranks in local processes, for tests where one of them dies mid-collective.

The ranks fork from multiprocessing's fork server with torch preloaded (elastic_tasks/forking.py),
not spawned: a spawned rank imports torch afresh (~4 CPU-s each on the 2-core box; ~20 such
processes a suite run). A forked rank starts with the server's environment, not the test's: a
test that passes a rank a setting passes it as an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from elastic_tasks.forking import forkserver_context

RANK_PRELOAD = ("torch", "torch.distributed")


def rank_context():  # noqa: ANN201 - multiprocessing's context type
    """The context to start test ranks from (``ctx.Process``, ``ctx.Queue``...)."""
    return forkserver_context(RANK_PRELOAD)


def run_ranks(target: Callable[..., None], args: tuple, nprocs: int) -> None:
    """``target(rank, *args)`` in ``nprocs`` forked ranks (torch.multiprocessing.spawn's calling
    convention); every rank must exit 0."""
    import torch.multiprocessing as mp

    rank_context()  # the server's preload, before torch starts the ranks from it
    mp.start_processes(target, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def run_pair(target: Callable[[int, str, str], None], tmp_path: Path, out: Path) -> None:
    """Run ``target(rank, init_file, out_file)`` as ranks 0 and 1; both must exit 0."""
    ctx = rank_context()
    procs = [ctx.Process(target=target, args=(r, str(tmp_path / "init"), str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
