"""A job's control plane on the Dask scheduler: plans, rendezvous addresses, status, events.

Plans are immutable Dask ``Variable``s (one per version, plus a pointer to the latest in
the scheduler's metadata, and a Dask ``Event`` per version that ranks long-poll on);
ranks report events on a Dask ``Queue`` that the coordinator drains; rank 0 publishes a
status ``Variable`` the coordinator reads for progress. Values travel as pickled bytes
because the scheduler stores only msgpack-encodable data.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from dataclasses import dataclass
from enum import Enum

from distributed import Client, Event, Queue, Variable

from elastic_tasks.protocol import EvalResult, Plan


class EventKind(str, Enum):
    READY = "ready"  # a new rank has built its model and waits to join ``version``
    APPLIED = "applied"  # generation ``version`` trains (sent by its rank 0)
    FAILED = "failed"  # a collective of generation ``version`` failed on this rank
    STRAGGLER = "straggler"  # rank ``uid`` was flagged as a persistent straggler
    FINISHED = "finished"  # the job reached its end (sent by rank 0)
    STOPPED = "stopped"  # every rank left on a stop plan; ``time`` is when training paused (rank 0)
    ERROR = "error"  # the rank task raised; ``detail`` says why


@dataclass(frozen=True, slots=True)
class RankEvent:
    kind: EventKind
    uid: str
    version: int
    step: int
    pause_s: float = 0.0
    world_size: int = 0
    detail: str = ""
    time: float = 0.0


@dataclass(frozen=True, slots=True)
class JobStatus:
    version: int
    step: int
    samples_seen: int
    world_size: int
    global_batch: int
    loss: float
    time: float
    noise_scale: float | None = None  # smoothed gradient noise scale (elastic_tasks.rank.noise.scale), for goodput policies
    lr: float | None = None  # the first parameter group's LR at that step
    # The job's latest periodic evaluations (recipe.eval_every), a few: statuses are sampled,
    # so one pushed between two reads still reaches the reader.
    recent_evals: tuple[EvalResult, ...] = ()
    accum_steps: int = 1  # micro-steps per step the ranks ran (the plan's, else the trainer's rule)


class JobBoard:
    def __init__(self, job_id: str, client: Client) -> None:
        if not job_id or any(c.isspace() for c in job_id):
            raise ValueError(f"job_id={job_id!r}: must be non-empty without whitespace")
        self.job_id = job_id
        self.client = client

    def _key(self, name: str) -> str:
        return f"malleable-{self.job_id}-{name}"

    def mark_started(self, uid: str) -> bool:
        """Record that rank ``uid`` ran; False if it already had (a re-run of its task)."""
        key = self._key(f"started-{uid}")
        if self.client.get_metadata(key, False):
            return False
        self.client.set_metadata(key, True)
        return True

    def forget(self) -> int:
        """Remove this job's plans, rendezvous, status, events and flags from the scheduler.

        A long-lived scheduler (``cluster=address``, the service) would otherwise keep every
        finished job's state for ever. Call it once no rank of the job runs; returns how many
        entries went.
        """
        return int(self.client.run_on_scheduler(_forget_on_scheduler, self._key("")))

    def _var(self, name: str) -> Variable:
        return Variable(f"malleable-{self.job_id}-{name}", client=self.client)

    # plans
    def publish(self, plan: Plan) -> None:
        self._var(f"plan-{plan.version}").set(pickle.dumps(plan))
        self.client.set_metadata(self._key("plan-latest"), plan.version)
        # Wakes every rank long-polling for this version: they learn of it without busy polling.
        Event(self._key(f"published-{plan.version}"), client=self.client).set()

    def wait_published(self, version: int, timeout: float) -> bool:
        """Long-poll (server side) until plan ``version`` is published; False after ``timeout``."""
        return bool(Event(self._key(f"published-{version}"), client=self.client).wait(timeout=timeout))

    def latest_version(self) -> int | None:
        # Scheduler metadata, not a Variable: reading an unset key is not an error there.
        value = self.client.get_metadata(self._key("plan-latest"), None)
        return None if value is None else int(value)

    def plan(self, version: int, timeout: float) -> Plan:
        try:
            return pickle.loads(self._var(f"plan-{version}").get(timeout=timeout))
        except TimeoutError:
            raise TimeoutError(f"job {self.job_id}: plan version {version} not published within {timeout:g} s") from None

    # the control plane's word that a generation lost a member (rank/health/hang_watch.py)
    def abort_generation(self, version: int) -> None:
        """Tell the ranks of generation ``version`` (and older) that a peer is gone: a data-plane
        collective they are blocked in will never complete (nccl hangs where gloo raises)."""
        self.client.set_metadata(self._key("aborted"), int(version))

    def aborted_generation(self) -> int:
        """The newest generation the coordinator declared broken (-1: none)."""
        return int(self.client.get_metadata(self._key("aborted"), -1))

    # rendezvous of one generation, hosted by its rank 0
    def set_rendezvous(self, version: int, host: str, port: int) -> None:
        self._var(f"rdzv-{version}").set(pickle.dumps((host, port)))

    def rendezvous(self, version: int, timeout: float) -> tuple[str, int]:
        try:
            return pickle.loads(self._var(f"rdzv-{version}").get(timeout=timeout))
        except TimeoutError:
            raise TimeoutError(f"job {self.job_id}: rank 0 of generation {version} did not open a rendezvous within {timeout:g} s") from None

    # status and events
    def set_status(self, status: JobStatus) -> None:
        self.client.set_metadata(self._key("status"), pickle.dumps(status))

    def status(self) -> JobStatus | None:
        value = self.client.get_metadata(self._key("status"), None)
        return None if value is None else pickle.loads(value)

    def post(self, event: RankEvent) -> None:
        if not event.time:
            event = dataclasses.replace(event, time=time.time())
        Queue(f"malleable-{self.job_id}-events", client=self.client).put(pickle.dumps(event))

    def drain(self, timeout: float) -> list[RankEvent]:
        """Events posted so far; if none, waits ``timeout`` and looks once more.

        Polls ``qsize`` instead of a blocking ``get``: the scheduler logs every timed-out get as an error.
        """
        queue = Queue(f"malleable-{self.job_id}-events", client=self.client)
        if not queue.qsize():
            time.sleep(timeout)
            if not queue.qsize():
                return []
        return [pickle.loads(b) for b in queue.get(batch=True)]


async def _forget_on_scheduler(prefix: str, dask_scheduler=None) -> int:  # noqa: ANN001  (runs on the scheduler)
    """Delete every Variable, Event, Queue and metadata key named ``prefix…`` (distributed 2026.8's extensions)."""
    removed = 0
    metadata = dask_scheduler.task_metadata
    for key in [k for k in metadata if isinstance(k, str) and k.startswith(prefix)]:
        del metadata[key]
        removed += 1
    variables = dask_scheduler.extensions["variables"]
    for name in [n for n in variables.variables if n.startswith(prefix)]:
        await variables.delete(name)
        removed += 1
    events = dask_scheduler.extensions["events"]
    for name in [n for n in list(events._events) if n.startswith(prefix) and not events._waiter_count.get(n)]:
        del events._events[name]
        events._waiter_count.pop(name, None)
        removed += 1
    queues = dask_scheduler.extensions["queues"]
    for name in [n for n in queues.queues if n.startswith(prefix)]:
        del queues.queues[name]
        queues.client_refcount.pop(name, None)
        removed += 1
    return removed
