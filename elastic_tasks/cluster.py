"""Worker groups: one Dask worker per GPU, each advertising the resource ``GPU=1``; which are
up (``gpu_workers``), which are free (``WorkerPool``), and warming them up for training.

The clusters themselves come from ``deploy`` (``deploy.local`` on this machine).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.comm import get_address_host

from elastic_tasks.devices import GPU_RESOURCE, loopback_warning
from elastic_tasks.coordinator.packing import choose_workers

log = logging.getLogger(__name__)


def check_worker_hosts(client: Client) -> str | None:
    """Log (and return) a warning when GPU workers span hosts and one host name resolves to loopback."""
    warning = loopback_warning(get_address_host(addr) for addr in gpu_workers(client))
    if warning:
        log.warning(warning)
    return warning


def warm_up(client: Client, entrypoint: str, workers: list[str] | None = None) -> None:
    """Import torch and build the recipe on the workers (default: all), so a rank started later joins fast.

    The scheduler imports the trainer too: it unpickles every submitted task, so the first
    rank task would otherwise make it import torch while the job's start waits (measured:
    the first job's plan publish took 1.3-1.9 s, later ones 0.01 s).
    """
    check_worker_hosts(client)
    client.run(_warm, entrypoint, workers=workers)
    client.run_on_scheduler(_import_trainer)


class TrainerImport(WorkerPlugin):
    """Imports the trainer (torch, torch.distributed) on every worker, including workers that join
    later: a long-lived service's first rank on a fresh worker then pays the regroup, not the import."""

    name = "malleable-trainer-import"

    def setup(self, worker) -> None:  # noqa: ANN001 - distributed's Worker
        _import_trainer()


def warm_up_trainer(client: Client) -> None:
    client.register_plugin(TrainerImport())
    client.run_on_scheduler(_import_trainer)


def _import_trainer() -> None:
    import elastic_tasks.rank.trainer  # noqa: F401  (what a rank task's pickle refers to)


def _warm(entrypoint: str) -> None:
    import elastic_tasks.rank.trainer  # noqa: F401  (torch.distributed, DDP)
    from elastic_tasks.recipe import build_optimizer, load_entry_point

    recipe = load_entry_point(entrypoint)
    # The first optimizer construction imports torch._dynamo: seconds, once per process.
    build_optimizer(recipe, recipe.build_model())


def worker_info(client: Client) -> dict[str, dict]:
    """Every worker the scheduler knows now, by address.

    Asked of the scheduler directly: ``Client.scheduler_info`` hands back a cache that the
    client's periodic refresh overwrites with a worker-less copy, so a read between the two
    sees no workers at all (tests/test_worker_view.py).
    """
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def gpu_workers(client: Client) -> list[str]:
    """Addresses of the workers advertising a GPU, sorted (stable rank placement)."""
    info = worker_info(client)
    return sorted(addr for addr, w in info.items() if w.get("resources", {}).get(GPU_RESOURCE, 0) >= 1)


@dataclass(slots=True)
class WorkerPool:
    """Which GPU workers are free; jobs take and give back whole workers."""

    client: Client
    busy: dict[str, str] = field(default_factory=dict)  # worker address -> job id

    def alive(self) -> list[str]:
        return gpu_workers(self.client)

    def free(self) -> list[str]:
        alive = set(self.alive())
        for addr in [a for a in self.busy if a not in alive]:
            del self.busy[addr]  # a dead worker frees nothing, but must not stay booked
        return [a for a in sorted(alive) if a not in self.busy]

    def take(self, job_id: str, n: int) -> list[str]:
        """``n`` free workers for ``job_id``, on as few hosts as possible counting those it holds (``packing``)."""
        free = self.free()
        if n > len(free):
            raise ValueError(f"gpus={n!r}: only {len(free)} free GPU worker(s) of {len(self.alive())}")
        chosen = choose_workers(free, n, held=[a for a, owner in self.busy.items() if owner == job_id])
        for addr in chosen:
            self.busy[addr] = job_id
        return chosen

    def give_back(self, workers: Iterable[str], owner: str | None = None) -> None:
        """Free ``workers``; with ``owner``, only those still booked to that job (a worker it gave
        up in a shrink may belong to another job by now)."""
        for addr in workers:
            if owner is None or self.busy.get(addr) == owner:
                self.busy.pop(addr, None)
