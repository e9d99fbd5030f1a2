"""A job's control plane on the Dask scheduler: plans, rendezvous addresses, status, events.

Plans are immutable Dask ``Variable``s (one per version, plus a pointer to the latest in
the scheduler's metadata, and a Dask ``Event`` per version that ranks long-poll on);
ranks report events on a Dask ``Queue`` that the coordinator drains; rank 0 publishes a
status ``Variable`` the coordinator reads for progress. Values travel as pickled bytes
because the scheduler stores only msgpack-encodable data.

Fencing: once the coordinator declares a rank lost (``fence``), the scheduler refuses every
write of that rank (``writer``), however late it comes (a frozen host thawed, a cut link back):
a rank's writes run on the scheduler as one check-and-write (``_write_on_scheduler``, behind a
scheduler handler of its own, ``WRITE_HANDLER``), so no race between the check and the write. A refused rank gets ``Fenced`` and leaves.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from distributed import Client, Event, Queue, Variable

from elastic_tasks.protocol import EvalResult, Plan


class Fenced(RuntimeError):
    """This rank was declared lost in generation ``version``: the job takes nothing more from it."""

    def __init__(self, uid: str, version: int) -> None:
        super().__init__(f"rank {uid} was declared lost in generation {version}: its writes are refused")
        self.uid, self.version = uid, version


@dataclass(frozen=True, slots=True)
class WriteLedger:
    """What the scheduler did with one rank's writes (evidence for tests and post-mortems)."""

    accepted: int
    refused: int
    last_accepted: float  # wall time (the scheduler's clock) of the last accepted write; 0: none


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
    # FAILED: how long the failed data-plane region had blocked this rank (0: it failed at once or
    # outside one). Recovery reads it: peers that waited a control timeout for a silent member
    # need not wait another for that member's own report.
    blocked_s: float = 0.0


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
    writer: str = ""  # the rank (uid) that published it


class JobBoard:
    """One job's board. ``writer``: the rank (uid) this board writes for — its writes are fenced
    (refused once the coordinator declared it lost); None: the coordinator's board."""

    def __init__(self, job_id: str, client: Client, writer: str | None = None) -> None:
        if not job_id or any(c.isspace() for c in job_id):
            raise ValueError(f"job_id={job_id!r}: must be non-empty without whitespace")
        self.job_id = job_id
        self.client = client
        self.writer = writer

    def _key(self, name: str) -> str:
        return f"malleable-{self.job_id}-{name}"

    def _write(self, target: str, name: str, data: object) -> str:
        """A write of this board's rank, checked against the fence on the scheduler, in one step."""
        if self.writer is None:
            raise RuntimeError("JobBoard._write: only a rank's board (writer set) writes through the fence")
        call = getattr(self.client.scheduler, WRITE_HANDLER)
        answer = self.client.sync(call, prefix=self._key(""), writer=self.writer, target=target, name=name, data=data)
        if answer is None:  # a scheduler without the handler (it answers None): install it, once per scheduler
            self.serve_fenced_writes()
            answer = self.client.sync(call, prefix=self._key(""), writer=self.writer, target=target, name=name, data=data)
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            raise Fenced(self.writer, int(answer))
        return str(answer)

    def serve_fenced_writes(self) -> None:
        """Install the scheduler's handler for ranks' writes (the coordinator, before its ranks run;
        a rank finding none installs it itself, the scheduler logging the miss once)."""
        self.client.run_on_scheduler(_install_write_handler)

    def mark_started(self, uid: str) -> bool:
        """Record that rank ``uid`` ran; False if it already had (a re-run of its task) or was fenced."""
        key = self._key(f"started-{uid}")
        if self.writer is not None:
            try:
                return self._write("started", key, True) == "ok"
            except Fenced:
                return False
        if self.client.get_metadata(key, False):
            return False
        self.client.set_metadata(key, True)
        return True

    # fencing: the coordinator's word that a rank is out, and the rank's check before a commit
    def fence(self, uids: Iterable[str], version: int) -> None:
        """Declare ``uids`` lost in generation ``version``: from now on the scheduler refuses their writes."""
        for uid in uids:
            self.client.set_metadata([self._key("fenced"), uid], [int(version), time.time()])

    def fenced(self) -> dict[str, tuple[int, float]]:
        """Each fenced rank: the generation it was lost in and when (wall time) it was fenced."""
        value = self.client.get_metadata(self._key("fenced"), None) or {}
        return {uid: (int(v), float(t)) for uid, (v, t) in value.items()}

    def confirm_writer(self) -> None:
        """Raise ``Fenced`` if this board's rank was declared lost (before committing a checkpoint)."""
        if self.writer is None:
            return
        value = self.client.get_metadata([self._key("fenced"), self.writer], None)
        if value is not None:
            raise Fenced(self.writer, int(value[0]))

    def ledger(self) -> dict[str, WriteLedger]:
        """What the scheduler accepted and refused from each rank so far."""
        value = self.client.get_metadata(self._key("writes"), None) or {}
        return {uid: WriteLedger(int(a), int(r), float(t)) for uid, (a, r, t) in value.items()}

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
        """Store ``plan``, point the latest version at it and wake the ranks long-polling for it:
        one round trip to the scheduler (three in a row were a third of plan-to-rank latency on a
        loaded box), and no rank can see the version before the plan is readable."""
        self.client.run_on_scheduler(_publish_on_scheduler, self._key(""), plan.version, pickle.dumps(plan))

    def wait_published(self, version: int, timeout: float) -> bool:
        """Long-poll (server side) until plan ``version`` is published; False after ``timeout``."""
        return bool(Event(self._key(f"published-{version}"), client=self.client).wait(timeout=timeout))

    def latest_version(self) -> int | None:
        # Scheduler metadata, not a Variable: reading an unset key is not an error there.
        value = self.client.get_metadata(self._key("plan-latest"), None)
        return None if value is None else int(value)

    def plan(self, version: int, timeout: float) -> Plan:
        return pickle.loads(self.plan_bytes(version, timeout))

    def plan_bytes(self, version: int, timeout: float) -> bytes:
        """Plan ``version`` as published (pickled), for a rank that passes it on unread."""
        try:
            return self._var(f"plan-{version}").get(timeout=timeout)
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
        if self.writer is not None:
            self._write("variable", self._key(f"rdzv-{version}"), pickle.dumps((host, port)))
            return
        self._var(f"rdzv-{version}").set(pickle.dumps((host, port)))

    def rendezvous(self, version: int, timeout: float) -> tuple[str, int]:
        try:
            return pickle.loads(self._var(f"rdzv-{version}").get(timeout=timeout))
        except TimeoutError:
            raise TimeoutError(f"job {self.job_id}: rank 0 of generation {version} did not open a rendezvous within {timeout:g} s") from None

    # status and events
    def set_status(self, status: JobStatus) -> None:
        if self.writer is not None:
            self._write("metadata", self._key("status"), pickle.dumps(status))
            return
        self.client.set_metadata(self._key("status"), pickle.dumps(status))

    def status(self) -> JobStatus | None:
        value = self.client.get_metadata(self._key("status"), None)
        return None if value is None else pickle.loads(value)

    def post(self, event: RankEvent) -> None:
        if not event.time:
            event = dataclasses.replace(event, time=time.time())
        if self.writer is not None:
            self._write("queue", self._key("events"), pickle.dumps(event))
            return
        Queue(self._key("events"), client=self.client).put(pickle.dumps(event))

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


# The scheduler's handler for a rank's fenced write. A handler of its own, not ``run_on_scheduler``:
# that unpickles the function, inspects its signature twice and logs, per call — 0.7 ms of
# scheduler CPU per write against 0.25 for a plain metadata write (1,024 ranks' first writes:
# benchmarks/control_plane_bench.py).
WRITE_HANDLER = "malleable_fenced_write"


def _install_write_handler(dask_scheduler=None) -> bool:  # noqa: ANN001  (runs on the scheduler)
    if WRITE_HANDLER not in dask_scheduler.handlers:

        async def malleable_fenced_write(prefix: str, writer: str, target: str, name: str, data: object) -> object:
            return await _write_on_scheduler(prefix, writer, target, name, data, dask_scheduler=dask_scheduler)

        dask_scheduler.handlers[WRITE_HANDLER] = malleable_fenced_write
    return True


async def _write_on_scheduler(prefix: str, writer: str, target: str, name: str, data: object, dask_scheduler=None) -> object:  # noqa: ANN001
    """Runs on the scheduler: refuse ``writer``'s write if it was fenced (answer: the generation it
    was lost in), else write ``data`` to ``name`` (answer: "ok", or "again" for a second start mark).

    One coroutine on the scheduler's event loop: nothing runs between the check and the write.
    ``target``: "metadata", "queue" (a Dask Queue's put), "variable" (a Dask Variable's set), or
    "started" (set a flag unless already set).
    """
    metadata = dask_scheduler.task_metadata
    fenced = metadata.get(f"{prefix}fenced", {}).get(writer)
    ledger = metadata.setdefault(f"{prefix}writes", {}).setdefault(writer, [0, 0, 0.0])
    if fenced is not None:
        ledger[1] += 1
        return int(fenced[0])
    if target == "metadata":
        metadata[name] = data
    elif target == "started":
        if metadata.get(name):
            return "again"
        metadata[name] = True
    elif target == "queue":
        queues = dask_scheduler.extensions["queues"]
        if name not in queues.queues:
            queues.create(name=name)
        await queues.put(name=name, data=data)
    elif target == "variable":
        await dask_scheduler.extensions["variables"].set(name=name, data=data)
    else:
        raise ValueError(f"target={target!r}: expected metadata, started, queue or variable")
    ledger[0] += 1
    ledger[2] = time.time()
    return "ok"


async def _publish_on_scheduler(prefix: str, version: int, data: bytes, dask_scheduler=None) -> None:  # noqa: ANN001
    """Runs on the scheduler: plan ``version`` stored, then the latest version, then its Event set
    (in that order, in one coroutine: a rank woken by the Event or reading the latest version
    always finds the plan)."""
    await dask_scheduler.extensions["variables"].set(name=f"{prefix}plan-{version}", data=data)
    dask_scheduler.task_metadata[f"{prefix}plan-latest"] = int(version)
    dask_scheduler.extensions["events"].event_set(name=f"{prefix}published-{version}")


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
