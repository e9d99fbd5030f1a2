"""Worker groups: one Dask worker per GPU, each advertising the resource ``GPU=1``; which are
up (``gpu_workers``), which are free (``WorkerPool``), and warming them up for training.

The clusters themselves come from ``deploy`` (``deploy.local`` on this machine).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.comm import get_address_host

from elastic_tasks.devices import GPU_RESOURCE, loopback_warning
from elastic_tasks.coordinator.packing import choose_workers

log = logging.getLogger(__name__)

# How often a take waiting for draining workers asks them again: one round trip per worker asked.
DRAIN_POLL_S = 0.05
# A nanny's restart: stop the stuck process, start a fresh one, which imports the trainer
# (``TrainerImport``) before it registers.
RESTART_TIMEOUT_S = 60.0


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
    client.run_on_scheduler(_import_trainer_soon)  # first: the scheduler imports while the workers do
    client.run(_warm, entrypoint, workers=workers)
    client.run_on_scheduler(_import_trainer)  # returns once that import is done: no task is unpickled before


class TrainerImport(WorkerPlugin):
    """Imports what a rank needs (torch, torch.distributed, the optimizers' torch._dynamo) on every
    worker, including workers that join later: a long-lived service's first rank on a fresh worker
    then pays the regroup, not the imports (a host joining a running job: measured 3-4 s less
    per new rank on 2 loaded cores)."""

    name = "malleable-trainer-import"

    def setup(self, worker) -> None:  # noqa: ANN001 - distributed's Worker
        _import_rank_runtime()


def warm_up_trainer(client: Client) -> None:
    client.run_on_scheduler(_import_trainer_soon)  # first: the scheduler imports while the workers do
    client.register_plugin(TrainerImport())
    client.run_on_scheduler(_import_trainer)  # returns once that import is done: no task is unpickled before


def _import_trainer() -> None:
    import elastic_tasks.rank.trainer  # noqa: F401  (what a rank task's pickle refers to)


def _import_trainer_soon() -> None:
    """On the scheduler: the trainer's import on a thread of its own, so that the scheduler's event
    loop serves on meanwhile (the workers' plugin set-up, their registrations, heartbeats) and
    the two imports overlap: done on the loop, it began only after the workers' and held a
    service's start for its whole length (torch: 5-10 s on 2 loaded cores). The caller then
    imports on the loop, which waits for this thread's import to end (Python's import lock)
    and only for that: the same chain of modules, so no other import can interleave."""
    threading.Thread(target=_import_trainer, name="malleable-trainer-import", daemon=True).start()


def _import_rank_runtime() -> None:
    _import_trainer()
    # The first optimizer construction imports torch._dynamo (seconds, once per process): a
    # rank builds its optimizer before it reports ready, so a grow waited for this import.
    import torch._dynamo  # noqa: F401


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


class NoFreeWorkers(ValueError):
    """A take found fewer free workers than asked for: nothing was taken, the caller may wait."""


@dataclass(slots=True)
class WorkerPool:
    """Which GPU workers are free; jobs take and give back whole workers.

    A worker given back is *draining* until the rank task that held it has ended: Dask cannot
    stop a running task, so a cancelled rank keeps the worker's only thread, and a rank placed
    there next would queue behind it and never start (a job then hangs at its start). A worker
    whose task outlives ``grace_s`` is restarted by its nanny and comes back under a new address.
    """

    client: Client
    busy: dict[str, str] = field(default_factory=dict)  # worker address -> job id
    # How long a given-back worker's rank may take to end before its process is restarted:
    # the control timeout by default (JobSettings.timeout_s; a dropped rank blocked in a
    # rendezvous or a collective gives up within it).
    grace_s: float = 30.0
    draining: dict[str, float] = field(default_factory=dict)  # worker address -> monotonic restart deadline
    restarting: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not (self.grace_s > 0):
            raise ValueError(f"WorkerPool.grace_s={self.grace_s!r}: must be > 0")

    def alive(self) -> list[str]:
        return gpu_workers(self.client)

    def heartbeat_ages(self, workers: list[str]) -> dict[str, float]:
        """Seconds since the scheduler last heard from each of ``workers`` (absent: not a worker now)."""
        return self.client.run_on_scheduler(_heartbeat_ages, list(workers))

    def free(self) -> list[str]:
        alive = set(self.alive())
        for addr in [a for a in self.busy if a not in alive]:
            del self.busy[addr]  # a dead worker frees nothing, but must not stay booked
        if self.draining:
            self._drain(alive)
        return [a for a in sorted(alive) if a not in self.busy and a not in self.draining]

    def take(self, job_id: str, n: int) -> list[str]:
        """``n`` free workers for ``job_id``, on as few hosts as possible counting those it holds (``packing``).

        Where enough are free only counting draining ones (a shrink's leaving rank still winding
        down as a grow takes its worker), waits for them, at most their grace and a restart.
        """
        free = self.free()
        wait_until = time.monotonic() + self.grace_s + RESTART_TIMEOUT_S
        while len(free) < n <= len(free) + len(self.draining) and time.monotonic() < wait_until:
            time.sleep(DRAIN_POLL_S)
            free = self.free()
        if n > len(free):
            draining = f", {len(self.draining)} still ending a rank" if self.draining else ""
            raise NoFreeWorkers(f"gpus={n!r}: only {len(free)} free GPU worker(s) of {len(self.alive())}{draining}")
        chosen = choose_workers(free, n, held=[a for a, owner in self.busy.items() if owner == job_id])
        for addr in chosen:
            self.busy[addr] = job_id
        return chosen

    def give_back(self, workers: Iterable[str], owner: str | None = None) -> None:
        """Free ``workers`` once their rank tasks have ended; with ``owner``, only those still
        booked to that job (a worker it gave up in a shrink may belong to another job by now)."""
        deadline = time.monotonic() + self.grace_s
        for addr in workers:
            if owner is None or self.busy.get(addr) == owner:
                self.busy.pop(addr, None)
                self.draining.setdefault(addr, deadline)

    def _drain(self, alive: set[str]) -> None:
        """Free the draining workers that run no task; restart those past their deadline."""
        for addr in [a for a in self.draining if a not in alive and a not in self.restarting]:
            del self.draining[addr]  # gone (restarted, or lost): its successor registers anew
        # Only live workers are asked: connecting to a gone one waits for the connect timeout.
        asked = [a for a in self.draining if a in alive and a not in self.restarting]
        running = self.client.run(_tasks_running, workers=asked, on_error="return") if asked else {}
        now = time.monotonic()
        for addr, count in running.items():
            if count == 0:
                self.draining.pop(addr, None)
            elif now > self.draining.get(addr, now):
                self._restart(addr)

    def _restart(self, addr: str) -> None:
        """Restart ``addr``'s process (its nanny) off the caller's thread: the pool's callers poll."""
        log.warning("worker %s: its rank task outlived the %g s grace after being given back; restarting it", addr, self.grace_s)
        self.restarting.add(addr)

        def restart() -> None:
            try:
                status = self.client.restart_workers([addr], timeout=RESTART_TIMEOUT_S, raise_for_error=False)
            except Exception as exc:  # noqa: BLE001 - retried after another grace
                status = {addr: f"{type(exc).__name__}: {exc}"}
            if status.get(addr) == "OK":
                self.draining.pop(addr, None)  # a fresh process runs nothing (if it kept the address)
            else:
                log.warning("worker %s: restart %s; trying again after %g s", addr, status.get(addr), self.grace_s)
                if addr in self.draining:
                    self.draining[addr] = time.monotonic() + self.grace_s
            self.restarting.discard(addr)

        threading.Thread(target=restart, name=f"restart-{addr}", daemon=True).start()


def _tasks_running(dask_worker) -> int:  # noqa: ANN001 - distributed's Worker
    """Tasks still running in the worker, a cancelled one included (Dask counts it as executing
    until its function returns); seceded tasks hold no thread but may hold the GPU: counted too."""
    return dask_worker.state.executing_count + len(dask_worker.state.long_running)


def _heartbeat_ages(workers: list[str], dask_scheduler=None) -> dict[str, float]:  # noqa: ANN001 - distributed's Scheduler
    now = time.time()
    states = dask_scheduler.workers
    return {addr: now - states[addr].last_seen for addr in workers if addr in states}
