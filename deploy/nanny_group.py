"""All of a local cluster's nannies in one ``dask spec`` process, so their workers fork from one fork server.

distributed's ``SubprocessCluster`` starts one ``dask spec`` process per worker: each nanny
imports distributed, and each starts its worker by spawning a fresh interpreter that imports
distributed and torch again (the fork server of ``deploy/forkserver.py`` would be one per
nanny, i.e. no saving). Here one process holds every nanny (``TrainingNanny``), and their
workers fork from the one server it starts, which imported the training code once.

The process still keeps apart from the caller: it starts with the caller's environment less
its secrets (``worker_environ``) and leads a process group of its own, so a Ctrl-C in the
caller's terminal reaches the caller alone and the cluster is closed in order; the fork server
and the workers forked from it inherit that group. Closing the group kills the process and
every process under it (``Subprocess.close``), as ``SubprocessCluster`` does per worker.
"""

from __future__ import annotations

import asyncio
import json
import sys

from distributed.deploy.subprocess import Subprocess

from deploy.worker_env import worker_environ

NANNY = "deploy.local.TrainingNanny"
# ``dask spec`` run as its own module: ``python -m dask spec`` first imports every installed
# package's ``dask`` CLI plugin (dask-kubernetes' alone: kr8s, httpx-ws, ~0.3 CPU-s and as long
# again before a scheduler or nanny process starts); the command it runs is this one.
DASK_SPEC = ("-m", "distributed.cli.dask_spec")


def direct_dask_spec(args: tuple[str, ...]) -> tuple[str, ...]:
    """``python -m dask spec ARGS`` as ``python -m distributed.cli.dask_spec ARGS``; other commands as given."""
    if args[1:4] == ("-m", "dask", "spec"):
        return (args[0], *DASK_SPEC, *args[4:])
    return args


def worker_names(group: str, workers: int) -> list[str]:
    """The names the scheduler will know the group's workers by: ``<group>-<i>``."""
    return [f"{group}-{i}" for i in range(workers)]


def group_spec(group: str, workers: int, options: dict, *, nanny: str = NANNY) -> dict:
    """The ``SpecCluster`` entry for a group of ``workers`` nannies started with ``options``.

    ``group`` tells the cluster the names its one process brings up (``SpecCluster``'s own
    convention for a process interface that starts several workers)."""
    if not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"workers={workers!r}: must be a positive integer")
    suffixes = [name[len(group):] for name in worker_names(group, workers)]
    return {"cls": NannyGroup, "options": {"workers": workers, "nanny": nanny, "nanny_kwargs": dict(options)}, "group": suffixes}


class NannyGroup(Subprocess):
    """One ``dask spec`` subprocess running ``workers`` nannies of class ``nanny`` for ``scheduler``."""

    def __init__(self, scheduler: str, *, name: str, workers: int, nanny: str, nanny_kwargs: dict) -> None:
        self.scheduler = scheduler
        self.name = str(name)
        self.workers = workers
        self.nanny = nanny
        self.nanny_kwargs = dict(nanny_kwargs)
        super().__init__()

    def spec(self) -> dict:
        """What ``dask spec`` starts: one entry per nanny, each named as the cluster expects."""
        return {n: {"cls": self.nanny, "opts": {**self.nanny_kwargs, "name": n}} for n in worker_names(self.name, self.workers)}

    async def _start(self) -> None:
        cmd = [sys.executable, *DASK_SPEC, self.scheduler, "--spec", json.dumps(self.spec())]
        self.process = await asyncio.create_subprocess_exec(*cmd, env=worker_environ(), process_group=0)
