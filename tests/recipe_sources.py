"""Source text of recipe modules that tests and benchmarks write into a job's directory.

A recipe module on disk (not a function here) because the ranks import it by entry point, as
they would a user's.
"""

from __future__ import annotations

import textwrap


def _mlp_tiny_with_forward(name: str, header: str, forward: str) -> str:
    """A recipe module: ``mlp_tiny`` whose model's forward is ``forward`` (the body of
    ``forward_replaced(x)``, which may call the original as ``forward(x)`` and count in ``calls[0]``);
    ``header``: the module's imports and constants beyond dataclasses and mlp_tiny."""
    body = textwrap.indent(textwrap.dedent(forward).strip("\n"), " " * 12)
    return f"""
import dataclasses
{textwrap.dedent(header).strip(chr(10))}

from elastic_tasks.examples import mlp_tiny


def recipe():
    base = mlp_tiny()
    build = base.build_model

    def build_model():
        model = build()
        forward = model.forward
        calls = [0]

        def forward_replaced(x):
{body}

        model.forward = forward_replaced
        return model

    return dataclasses.replace(base, name={name!r}, build_model=build_model)
"""


def failing_forward_recipe(name: str, message: str, stamp_file: str | None = None) -> str:
    """``mlp_tiny`` whose forward raises ``RuntimeError(message)`` once a process group exists.

    Fine in the coordinator's pre-flight check (no process group), so it fails in the ranks'
    first step. ``stamp_file``: the failing rank first writes ``time.time()`` there.
    """
    header = f"""
        import time

        import torch.distributed as dist

        STAMP_FILE = {stamp_file!r}
    """
    forward = f"""
        if dist.is_initialized():
            if STAMP_FILE:
                with open(STAMP_FILE, "w") as f:
                    f.write(repr(time.time()))
            raise RuntimeError({message!r})
        return forward(x)
    """
    return _mlp_tiny_with_forward(name, header, forward)


def local_collective_failure_recipe(name: str, marker: str, rank: int, after_calls: int) -> str:
    """``mlp_tiny`` whose forward on ``rank`` raises ``CollectiveFailure`` once (the first process to
    remove ``marker``), after ``after_calls`` forwards: that rank leaves the step's collective to
    report, alive, its sockets open, while its peers wait on it there (a link that failed on one
    host only)."""
    header = f"""
        import os

        import torch.distributed as dist

        from elastic_tasks.rank.health.collective import CollectiveFailure

        MARKER = {marker!r}
    """
    forward = f"""
        calls[0] += 1
        if calls[0] > {after_calls} and dist.is_initialized() and dist.get_rank() == {rank}:
            try:
                os.remove(MARKER)
            except FileNotFoundError:
                pass
            else:
                raise CollectiveFailure("this rank's link failed (injected)")
        return forward(x)
    """
    return _mlp_tiny_with_forward(name, header, forward)
