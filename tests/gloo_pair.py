"""Two real gloo ranks in spawned processes, for tests where one of them dies mid-collective."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path


def run_pair(target: Callable[[int, str, str], None], tmp_path: Path, out: Path) -> None:
    """Run ``target(rank, init_file, out_file)`` as ranks 0 and 1; both must exit 0."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, str(tmp_path / "init"), str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
