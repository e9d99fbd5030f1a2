"""The checkpoint-restart path: rank 0 saves, every rank (and its process) stops, new ranks load the file.

The baseline the in-place switch is measured against, and the way to move a job whose state
cannot travel over the network. The pause runs from the old generation's stop to the new
one's first ready step.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from elastic_tasks.board import EventKind, RankEvent
from elastic_tasks.cluster import warm_up
from elastic_tasks.coordinator.lifecycle import CoordinatorState
from elastic_tasks.coordinator.outcomes import RescaleOutcome
from elastic_tasks.protocol import FROM_CHECKPOINT, Plan, PlanKind, check_batch

if TYPE_CHECKING:
    from elastic_tasks.coordinator.job import JobCoordinator

# A restarted worker comes back under its nanny: how often to look for enough free ones.
FREE_WORKER_POLL_S = 0.2


def restart_rescale(job: JobCoordinator, gpus: int, global_batch: int | None, at_step: int | None, restart_processes: bool) -> RescaleOutcome | None:
    """None if the job ended before the stop took effect."""
    if job.config.checkpoint_dir is None:
        raise ValueError("checkpoint_dir=None: the restart path needs a checkpoint directory")
    batch = job.global_batch if global_batch is None else global_batch
    check_batch(batch, gpus)
    with job.plan_lock:
        job.lifecycle.move(CoordinatorState.RESCALING)
        before = job.members
        old_workers = [job.worker_of[u] for u in before]
        version = job.next_version()
        job.publish(Plan(version, PlanKind.CHECKPOINT_STOP, (), batch, at_step=at_step))
        stopped = job.wait_for(lambda h: h.stopped.get(version) or h.finished, job.startup_s + job.eta_s(at_step))
        if not isinstance(stopped, RankEvent) or stopped.kind != EventKind.STOPPED:
            job.lifecycle.move(CoordinatorState.RUNNING, only_from=(CoordinatorState.RESCALING,))
            return None
        for uid in before:
            job.futures[uid].result(timeout=job.startup_s)
        # Hand finished ranks' results over now: a restarted worker would otherwise make
        # the scheduler recompute the tasks whose results it held.
        job.harvest()
        if restart_processes:
            # Our own wait below, not restart_workers': it counts every worker of the cluster.
            job.client.restart_workers(old_workers, timeout=job.startup_s, raise_for_error=False)
        job.pool.give_back(old_workers)
        wait_until = time.monotonic() + job.startup_s
        while len(job.pool.free()) < gpus and time.monotonic() < wait_until:
            time.sleep(FREE_WORKER_POLL_S)
        workers = job.pool.take(job.job_id, gpus)
        if restart_processes:
            # Fresh processes import torch and build the recipe first, as at cluster start
            # (measured: part of the restart's pause).
            warm_up(job.client, job.entrypoint, workers)
        version = job.next_version()
        uids = [job.launch(addr, version) for addr in workers]
        job.publish(Plan(version, PlanKind.RESCALE, tuple(uids), batch, source=FROM_CHECKPOINT))
        job.members, job.global_batch, job.accum_steps = tuple(uids), batch, None
    event = job.wait_applied(version, job.startup_s)
    if event is None:
        raise job.fail("restarted ranks did not come up")
    job.lifecycle.move(CoordinatorState.RUNNING, only_from=(CoordinatorState.RESCALING,))
    outcome = RescaleOutcome(version, PlanKind.RESCALE, len(before), gpus, batch, event.step, event.time - stopped.time, 0.0, restart=True)
    job.rescales.append(outcome)
    return outcome
