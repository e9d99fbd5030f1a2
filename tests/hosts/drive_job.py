"""Drive one elastic job from inside a host namespace (the test process cannot reach the namespaces' subnet).

``python -m tests.hosts.drive_job SCHEDULER WORKERS GPUS STEPS TIMEOUT_S [FAULT_STEP [idle|- [CHECKPOINT_DIR]]]``

``idle``: after the job, wait until no worker executes a task (a thawed rank gone) and report when.
``CHECKPOINT_DIR``: rank 0 checkpoints there every ``CHECKPOINT_EVERY`` steps (a path every host shares).

Prints ``phase <name> <monotonic time>`` as it connects, warms up and starts the job (where a
test's time goes), ``ready <json worker_of>`` once the job reached FAULT_STEP (the test then injects its
fault), ``resumed`` once training resumed after a recovery (the test may then heal its fault),
and as its last line the job's outcome as one JSON object, with the monotonic time
(system-wide, comparable with the test's) at which the coordinator entered and left recovery,
and what the board holds about fencing (read after the idle wait: after a fenced rank came back).
"""

from __future__ import annotations

import json
import sys
import threading
import time

from distributed import Client

from elastic_tasks.cluster import WorkerPool, warm_up
from elastic_tasks.coordinator.job import JobCoordinator
from elastic_tasks.coordinator.lifecycle import CoordinatorState
from elastic_tasks.protocol import TrainConfig

ENTRY = "elastic_tasks.examples.recipes:mlp_tiny"
BATCH = 48
CHECKPOINT_EVERY = 2


def main(scheduler: str, workers: int, gpus: int, steps: int, timeout_s: float, fault_step: int = -1, check_idle: bool = False, checkpoint_dir: str | None = None) -> None:
    with Client(scheduler, timeout=60) as client:
        _phase("connected")
        client.wait_for_workers(workers, timeout=120)
        warm_up(client, ENTRY)
        _phase("warm")
        config = TrainConfig(
            global_batch=BATCH, max_steps=steps, record_indices=True, timeout_s=timeout_s, data_timeout_s=timeout_s,
            checkpoint_dir=checkpoint_dir, checkpoint_every=CHECKPOINT_EVERY if checkpoint_dir else 0,
        )  # fmt: skip
        delays = {i: 0.1 for i in range(gpus)}  # a step long enough that the fault lands mid-run
        job = JobCoordinator(client, WorkerPool(client, grace_s=timeout_s), f"hosts-{time.monotonic_ns()}", ENTRY, config, delays=delays)
        job.start(gpus)
        _phase("started")
        times: dict[str, float] = {}

        def watch() -> None:  # when the coordinator entered and left recovery
            while not job.finished:
                state = job.lifecycle.state
                if state == CoordinatorState.RECOVERING:
                    times.setdefault("recovering", time.monotonic())
                elif "recovering" in times and state == CoordinatorState.RUNNING and "resumed" not in times:
                    times["resumed"] = time.monotonic()
                    print("resumed", flush=True)
                time.sleep(0.02)

        threading.Thread(target=watch, daemon=True).start()
        if fault_step >= 0:
            while (s := job.status()) is None or s.step < fault_step:
                time.sleep(0.05)
            print("ready", json.dumps(dict(job.worker_of)), flush=True)
        result = job.wait(240)
        _phase("ended")
        # A lost rank's task was cancelled, but a frozen-then-thawed rank runs on in its worker's
        # thread until it sees it was left behind: how long until no worker executes anything.
        # (Not across a cut link: the unreachable worker would hold the question for a TCP timeout.)
        idle_after_s, t0 = None, time.monotonic()
        while check_idle and time.monotonic() - t0 < 6 * timeout_s:
            busy = client.run(_executing)
            if not any(busy.values()):
                idle_after_s = time.monotonic() - t0
                break
            time.sleep(0.2)
        out = {
            "finished": result.finished,
            "steps": result.steps,
            "samples_seen": result.samples_seen,
            "batch": BATCH,
            "history": [[h.step, h.world_size, h.loss_samples] for h in result.history],
            "ranks": {r.uid: {"exit": r.exit.name, "indices": [[s, list(i)] for s, i in r.indices]} for r in result.ranks},
            "recoveries": [{"failed_version": r.failed_version, "version": r.version, "lost": list(r.lost), "survivors": list(r.survivors), "resumed_step": r.resumed_step, "pause_s": r.pause_s} for r in result.recoveries],
            "worker_of": dict(job.worker_of),
            "times": times,
            "idle_after_s": idle_after_s,
            # The scheduler's side of fencing: who was declared lost (generation, wall time), and
            # what it accepted and refused from each rank (a thawed rank's late writes are refused).
            "fenced": job.board.fenced(),
            "ledger": {uid: [w.accepted, w.refused, w.last_accepted] for uid, w in job.board.ledger().items()},
            "status_writer": (st := job.board.status()) and st.writer,
            "status_version": st and st.version,
            "wall_now": time.time(),
        }
        print(json.dumps(out), flush=True)


def _phase(name: str) -> None:
    print("phase", name, time.monotonic(), flush=True)


def _executing(dask_worker) -> int:  # noqa: ANN001 - distributed's Worker
    return len(dask_worker.state.executing)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]), int(a[2]), int(a[3]), float(a[4]), *(int(x) for x in a[5:6]), *(x == "idle" for x in a[6:7]), *a[7:8])
