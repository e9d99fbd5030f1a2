"""Source text of recipe modules that tests and benchmarks write into a job's directory.

A recipe module on disk (not a function here) because the ranks import it by entry point, as
they would a user's.
"""

from __future__ import annotations


def failing_forward_recipe(name: str, message: str, stamp_file: str | None = None) -> str:
    """``mlp_tiny`` whose forward raises ``RuntimeError(message)`` once a process group exists.

    Fine in the coordinator's pre-flight check (no process group), so it fails in the ranks'
    first step. ``stamp_file``: the failing rank first writes ``time.time()`` there.
    """
    return f"""
import dataclasses
import time

import torch.distributed as dist

from elastic_tasks.examples import mlp_tiny

STAMP_FILE = {stamp_file!r}


def recipe():
    base = mlp_tiny()
    build = base.build_model

    def build_model():
        model = build()
        forward = model.forward

        def failing_forward(x):
            if dist.is_initialized():
                if STAMP_FILE:
                    with open(STAMP_FILE, "w") as f:
                        f.write(repr(time.time()))
                raise RuntimeError({message!r})
            return forward(x)

        model.forward = failing_forward
        return model

    return dataclasses.replace(base, name={name!r}, build_model=build_model)
"""


def local_collective_failure_recipe(name: str, marker: str, rank: int, after_calls: int) -> str:
    """``mlp_tiny`` whose forward on ``rank`` raises ``CollectiveFailure`` once (the first process to
    remove ``marker``), after ``after_calls`` forwards: that rank leaves the step's collective to
    report, alive, its sockets open, while its peers wait on it there (a link that failed on one
    host only)."""
    return f"""
import dataclasses
import os

import torch.distributed as dist

from elastic_tasks.examples import mlp_tiny
from elastic_tasks.rank.health.collective import CollectiveFailure

MARKER = {marker!r}


def recipe():
    base = mlp_tiny()
    build = base.build_model

    def build_model():
        model = build()
        forward = model.forward
        calls = [0]

        def forward_failing_once(x):
            calls[0] += 1
            if calls[0] > {after_calls} and dist.is_initialized() and dist.get_rank() == {rank}:
                try:
                    os.remove(MARKER)
                except FileNotFoundError:
                    pass
                else:
                    raise CollectiveFailure("this rank's link failed (injected)")
            return forward(x)

        model.forward = forward_failing_once
        return model

    return dataclasses.replace(base, name={name!r}, build_model=build_model)
"""
