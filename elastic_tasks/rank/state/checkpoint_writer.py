"""Rank 0's periodic checkpoints, written off the step loop.

Writing a checkpoint (serialise ~100 MB, fsync, rename, or an object-store upload) inside the
step loop stalls rank 0 for its whole duration, and every other rank with it at the next
collective. Here the loop only pays for a snapshot (the state's tensors copied to host
memory, ``ElasticState.snapshot``); a background thread serialises and writes it with
``write_checkpoint`` (temp file + fsync + rename: a crash mid-write leaves the previous
checkpoint whole, never a torn one). One write at a time: the next save first waits for
the last, so checkpoints land in order and at most one snapshot is held besides the live
state. A write's error is raised by the next ``save`` or ``wait``, in the loop's thread.
"""

from __future__ import annotations

import os
import threading

from elastic_tasks.rank.state.elastic import CommitGuard, ElasticState, write_checkpoint

__all__ = ["CheckpointWriter", "CommitGuard"]


class CheckpointWriter:
    """``guard``: who writes, and the check a write must pass before it replaces the last
    checkpoint (a fenced rank's ``Fenced`` comes back through ``save``/``wait``); None: no check."""

    def __init__(self, guard: CommitGuard | None = None) -> None:
        self.guard = guard
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.written = 0  # checkpoints completed

    def save(self, state: ElasticState, directory: str | os.PathLike[str]) -> None:
        """Snapshot ``state`` now and write it in the background (after the previous write)."""
        self.wait()
        payload = state.snapshot()
        self._thread = threading.Thread(target=self._write, args=(directory, payload), name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _write(self, directory: str | os.PathLike[str], payload: dict[str, object]) -> None:
        try:
            write_checkpoint(directory, payload, self.guard)
            self.written += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the loop's thread by wait()
            self._error = exc

    def wait(self) -> None:
        """Block until the write in flight (if any) is on disk; raise its error, if it failed."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
