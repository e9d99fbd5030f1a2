"""One torch process group per generation, formed over a fresh ``TCPStore`` on rank 0's host.

The store is the control plane (short ``timeout_s``); the group's collectives are the data plane
(``data_timeout_s``). Rank 0 publishes the store's address on the job board; the others read it
there. A generation's group is destroyed before the next one forms.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import torch.distributed as dist

from elastic_tasks.board import JobBoard
from elastic_tasks.devices import process_group_backend
from elastic_tasks.protocol import TrainConfig
from elastic_tasks.rank.health.hang_watch import configure_nccl_error_mode


class ProcessGroups:
    """Forms and drops this rank's process group, one generation at a time."""

    def __init__(self, board: JobBoard, host: str, backend: str, config: TrainConfig) -> None:
        self.board = board
        self.host = host
        self.backend = backend
        self.config = config
        self._stores: list[dist.TCPStore] = []

    def form(self, version: int, rank: int, world: int) -> None:
        """Join generation ``version``'s group as ``rank`` of ``world``."""
        timeout = timedelta(seconds=self.config.timeout_s)
        configure_nccl_error_mode(self.backend)
        if rank == 0:
            store = dist.TCPStore(self.host, 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
            self.board.set_rendezvous(version, self.host, store.port)
        else:
            host, port = self.board.rendezvous(version, timeout=self.config.timeout_s)
            store = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
        # Keep the previous generation's store alive a little longer: a slow peer may still close on it.
        self._stores = [*self._stores[-1:], store]
        data_timeout = timedelta(seconds=self.config.data_timeout_s)
        dist.init_process_group(process_group_backend(self.backend), store=store, rank=rank, world_size=world, timeout=data_timeout)

    @staticmethod
    def drop() -> None:
        """Leave the current group, if any (a failed peer may make this raise: it is gone either way)."""
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
