"""``serve``: the one loop (``allocator.loop.run_loop``) with a wall clock, the Dask executor and
the store as its job source, until stopped.

Start-up: take the store's lease (or refuse), fence what a crashed predecessor left running,
hand every unfinished job to the loop (running ones resume from their checkpoints). Shut-down
(SIGTERM, Ctrl-C, ``stop``): running jobs checkpoint and stop, the store marks them
suspended, the lease is released; the next service resumes them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from distributed import Client

from allocator.admission import OverflowMode
from allocator.physics.goodput import NoiseModel
from allocator.loop import LoopResult, LoopSettings, StepReport, run_loop
from allocator.profiles.measured import TrustSettings
from allocator.fairness.policy import fair
from allocator.fairness.teams import TeamTable
from allocator.policies import Policy, parse_policy
from elastic_tasks.cluster import gpu_workers, warm_up_trainer
from elastic_tasks.workloads import resolve_workload
from elastic_tasks.executor import DaskExecutor, JobSettings, WallClock
from service.feed import StoreFeed
from service.fence import fence
from service.store.lease import Lease, Taken
from service.store.records import RESUMABLE, JobState
from service.recorder import StoreRecorder
from service.store import JobStore, redact
from service.tracking import ServiceTracking, service_journal


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    store_url: str
    checkpoint_root: str
    policy: str = "elastic_dp"
    interval_s: float = 10.0
    overflow: OverflowMode = OverflowMode.QUEUE
    react: bool = True
    # A shared cluster: a small job may pass a large one that waits for GPUs.
    strict_fifo: bool = False
    poll_s: float = 0.2
    progress_s: float = 1.0
    checkpoint_every: int = 20
    collective_timeout_s: float = 60.0
    lease_ttl_s: float = 10.0
    tracking_uri: str | None = None
    experiment: str = "malleable"
    # The experiment's artifact root if this service creates it (service.tracking.experiment.artifact_root).
    artifact_location: str | None = None
    # Where the MLflow journal of a non-sqlite store lives (the state directory: a volume on Kubernetes).
    state_dir: str | None = None
    # MALLEABLE_ALLOWED_ENTRYPOINTS as patterns; None: any module may run.
    allowed_entrypoints: tuple[str, ...] | None = None
    trust_measurements: bool = True  # the loop trusts what jobs measured over the model (allocator.profiles.measured)
    # Fair sharing among teams (allocator.fairness): the policy decides inside each team's share.
    teams: TeamTable | None = None

    def __post_init__(self) -> None:
        for name in ("interval_s", "poll_s", "progress_s", "collective_timeout_s", "lease_ttl_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0 and value != float("inf")):
                raise ValueError(f"ServiceConfig.{name}={value!r}: must be a finite number > 0")
        if not (isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 1):
            raise ValueError(f"ServiceConfig.checkpoint_every={self.checkpoint_every!r}: must be an integer >= 1 (jobs resume from checkpoints)")
        self.build_policy()  # a bad name or parameter fails here, naming it
        if self.policy.startswith("idle_nodes"):
            raise ValueError(f"ServiceConfig.policy={self.policy!r}: idle-node policies need node names, which the service's workers do not expose")


    def build_policy(self) -> Policy:
        """The configured policy: a name or a variant (``goodput_dp:p=-1``), built as every route
        builds it (``allocator.policies.parse_policy``): what it leaves out is the policy's default."""
        return parse_policy(self.policy).build()


class Service:
    """One service: ``acquire()`` the store's lease (before any cluster starts), then ``run()``;
    ``stop()`` (any thread, a signal handler) ends it cleanly."""

    def __init__(self, config: ServiceConfig, say: Callable[[str], None] = print, stopping: threading.Event | None = None) -> None:
        self.config, self.say = config, say
        # ``serve`` shares its signal latch's event: a stop asked before the service exists holds.
        self.stopping = stopping if stopping is not None else threading.Event()
        self.store = JobStore(config.store_url)
        self.lease = Lease(self.store, config.lease_ttl_s)
        self.result: LoopResult | None = None
        self.executor: DaskExecutor | None = None
        self.started_ms = 0
        self.lease_watch: threading.Thread | None = None
        self.client: Client | None = None
        self.cluster_owned = False
        self._taken: Taken | None = None

    def acquire(self) -> None:
        """Take the store's lease; LeaseHeldError if another service schedules this store,
        StorePermissionError (one line) if the role may not write the lease table."""
        with self.store.writing("take the scheduler's lease (SELECT and UPDATE on table lease; serve needs a writing role)"):
            self._taken = self.lease.acquire()

    @property
    def acquired(self) -> bool:
        return self._taken is not None

    def orphaned_cluster(self) -> str | None:
        """The scheduler address of the cluster a crashed predecessor started itself, if it still
        answers: adopting it (warm workers, torch imported) saves starting a new one."""
        previous = self._taken.previous if self._taken is not None else None
        if previous is None or not previous.cluster_owned or not previous.cluster_address:
            return None
        try:
            with Client(previous.cluster_address, timeout=3, set_as_default=False) as probe:
                probe.scheduler_info()
        except (OSError, TimeoutError):
            return None
        return previous.cluster_address

    def stop(self) -> None:
        """From any thread (not from a signal handler: ``Event.set`` takes a lock)."""
        self.stopping.set()

    def fast_stop(self) -> None:
        """The bounded stop (a third SIGTERM): no checkpoint is waited for. The store stays
        consistent: every job running here is suspended (it resumes from its last checkpoint,
        as after a crash), the lease is released, an owned cluster is told to shut down."""
        if self._taken is not None:
            # This service holds the lease: every job "running" in the store is its own.
            for row in self.store.jobs(states=[JobState.RUNNING]):
                self.store.set_state(row.id, JobState.SUSPENDED, only_from=(JobState.RUNNING,), gpus=0, batch=0)
        self.lease.release()
        if self.client is not None and self.cluster_owned:
            self.client.shutdown()

    def checkpoint_dir(self, job_id: str) -> str:
        # A path or an fsspec URL (s3://...): joined as text, not as a local Path.
        return f"{self.config.checkpoint_root.rstrip('/')}/{job_id}"

    def run(self, client: Client, *, cluster_owned: bool, observer: Callable[[StepReport], None] | None = None) -> LoopResult:
        """Serve until stopped; ``observer`` also hears every decision (progress displays)."""
        cfg = self.config
        if self._taken is None:
            self.acquire()
        taken = self._taken
        self.client, self.cluster_owned = client, cluster_owned
        # MLflow starts on a thread of its own (seconds of imports): the loop does not wait for it.
        tracking = ServiceTracking(
            cfg.tracking_uri, cfg.experiment, warn=self.say, job_tags={"malleable.policy": cfg.policy},
            on_run=lambda job_id, run_id: self.store.update_job(job_id, mlflow_run_id=run_id),
            journal=service_journal(cfg.store_url, cfg.state_dir),  # what MLflow cannot take now waits there, for this service or the next
            artifact_location=cfg.artifact_location,
        )  # fmt: skip
        executor: DaskExecutor | None = None
        feed: StoreFeed | None = None
        try:
            self.lease.note_cluster(self.client.scheduler.address, self.cluster_owned)
            self.lease.keep_renewed()
            resume = self.store.jobs(states=RESUMABLE)
            if taken.previous is not None:
                running = [r for r in resume if r.state is JobState.RUNNING]
                fenced = fence(taken.previous, running, client)
                if fenced.reached:
                    self.say(f"previous service died: its ranks of {len(fenced.stopped)} job(s) checkpointed and stopped" + (", its cluster shut down" if fenced.shut_down else ""))
            if resume:
                self.say(f"{len(resume)} unfinished job(s) from the store: " + ", ".join(f"{r.id} ({r.state.value})" for r in resume))
            if not self.stopping.is_set():  # a stop asked during start-up: straight to the (empty) loop
                warm_up_trainer(self.client)
            clock = WallClock()
            self.started_ms = int(time.time() * 1000)  # the loop's t = 0 as a timestamp
            settings = JobSettings(timeout_s=cfg.collective_timeout_s, checkpoint_root=cfg.checkpoint_root, checkpoint_every=cfg.checkpoint_every, poll_s=cfg.poll_s)
            policy = cfg.build_policy()
            if cfg.teams is not None:
                policy = fair(policy, cfg.teams, cfg.strict_fifo)
            # A goodput policy counts work in base-batch-equivalent samples: the executor counts the same way.
            noise_model = policy if isinstance(policy, NoiseModel) else None
            executor = self.executor = DaskExecutor(
                self.client, lambda spec: resolve_workload(spec.workload, spec.id), settings, clock=clock, noise_model=noise_model,
                build_recipe_here=False,  # the feed found the module; ranks build the recipe: no torch here
            )
            team_of: dict[str, str] = {}  # each job's team, as the feed assigned it (teams configured)
            recorder = StoreRecorder(
                self.store, tracking, self.checkpoint_dir, lambda j: executor.jobs[j].board_id if j in executor.jobs else None, self.say,
                result_of=executor.result, rates=executor, team_of=team_of,
            )  # fmt: skip
            tracking.service_started({"policy": policy.name, "interval_s": str(cfg.interval_s), "scheduler": self.client.scheduler.address})
            heartbeat = _Heartbeat(self.store, executor, tracking, self.client, cfg.progress_s)
            feed = StoreFeed(self.store, self.stopping, cfg.poll_s, resume, on_poll=heartbeat, allowed=cfg.allowed_entrypoints, teams=cfg.teams, team_of=team_of)
            self.lease_watch = threading.Thread(target=self._watch_lease, daemon=True, name="malleable-lease-watch")
            self.lease_watch.start()
            loop_settings = LoopSettings(
                interval_s=cfg.interval_s, overflow=cfg.overflow, strict_fifo=cfg.strict_fifo, react_to_events=cfg.react,
                trust=TrustSettings() if cfg.trust_measurements else None,
            )  # fmt: skip
            shared = "" if cfg.teams is None else f", fair shares among {len(cfg.teams.names())} teams"
            self.say(f"serving {redact(self.store.url)} with {cfg.policy}{shared} on {len(gpu_workers(self.client))} GPU worker(s)")
            self.result = run_loop(
                feed, policy, lambda: len(gpu_workers(self.client)), clock, executor, loop_settings,
                observer=recorder.observer if observer is None else _both(recorder.observer, observer), on_job=recorder.on_job,
            )  # fmt: skip
            saved = executor.suspend_all()
            for job_id, ok in saved.items():
                # Saved or not, the job resumes from its newest checkpoint when a service starts.
                self.store.set_state(job_id, JobState.SUSPENDED, only_from=(JobState.RUNNING,), gpus=0, batch=0)
                tracking.job_ended(job_id, "KILLED")
            if saved:
                self.say(f"suspended {len(saved)} running job(s): " + ", ".join(f"{j} ({'checkpointed' if ok else 'from its last checkpoint'})" for j, ok in saved.items()))
            return self.result
        finally:
            if feed is not None:
                feed.close()
            if executor is not None:
                executor.close()
            tracking.close()
            self.lease.release()

    def _watch_lease(self) -> None:
        while not self.stopping.wait(0.5):
            if self.lease.lost.is_set():
                self.say("lost the job store's lease (another service took over): stopping")
                self.stopping.set()


def _both(first: Callable[[StepReport], None], second: Callable[[StepReport], None]) -> Callable[[StepReport], None]:
    def call(report: StepReport) -> None:
        first(report)
        second(report)

    return call


class _Heartbeat:
    """Every ``every_s``: each running job's progress into the store and MLflow, the cluster's use into MLflow."""

    def __init__(self, store: JobStore, executor: DaskExecutor, tracking: ServiceTracking, client: Client, every_s: float) -> None:
        self.store, self.executor, self.tracking, self.client, self.every_s = store, executor, tracking, client, every_s
        self._next = 0.0

    def __call__(self, now: float) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every_s
        progress: dict[str, float] = {}
        busy = 0
        for job_id, job in self.executor.jobs.items():
            if not job.members or job.finished:
                continue
            busy += len(job.members)
            status = job.status()
            if status is not None:
                # In the unit of the job's total_samples (base-batch-equivalent under a goodput policy).
                progress[job_id] = self.executor.progress(job_id, self.executor.clock.now())
                self.tracking.metrics(job_id, {"loss": status.loss, "samples_seen": status.samples_seen, "world_size": status.world_size}, step=status.step)
        self.store.record_progress(progress)
        self.tracking.metrics(None, {"gpus_alive": len(gpu_workers(self.client)), "gpus_busy": busy})
