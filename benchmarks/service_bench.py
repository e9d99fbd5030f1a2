"""The scheduler service: submission latency, store throughput, decision time, crash recovery.

* ``submit_to_running_p50_s`` / ``_p95_s``: an embedded service (2 virtual GPU workers, react
  to events, poll 0.2 s) gets ``--latency-jobs`` small jobs, one after the other on an idle
  cluster; per job, from the client's submit call returning to the job's START generation
  applied (its ranks started, process group formed, state in place: the moment its first
  training step begins), nothing subtracted.
* ``submissions_per_s``: ``--submissions`` jobs through ``ServiceClient.submit`` into an empty
  sqlite store, one transaction each, one client; ``submissions_per_s_postgres`` the same on
  the PostgreSQL server at 127.0.0.1:5432 when it answers (``_async_commit``: with
  ``JobStore(async_commit_submissions=True)``, a commit that does not wait for its WAL flush).
* ``decision_ms_1000_queued``: one decision of the loop (admission + ``elastic_dp``) with 1000
  queued jobs on 64 GPUs, median of 5.
* ``poll_ms_1000_queued`` / ``poll_ms_10000_queued``: one poll of a running service's feed
  (sqlite) with that many jobs queued and nothing new — what it does every poll interval —
  median of 50; ``first_load_ms_*``: its first poll, which reads and parses them all (once per
  service start). ``poll_ms_10000_queued_postgres`` / ``_listen``: the same on PostgreSQL,
  reading, and with LISTEN/NOTIFY (nothing heard: nothing read).
* ``double_sigterm_exit_s``: a serving process with a job training gets SIGTERM twice; seconds
  from the first to its exit (the job checkpointed and suspended).
* ``decision_ms_<policy>_1000_queued`` (``decision_ms_by_policy``): the same decision for
  ``elastic_dp`` and ``goodput_dp`` on 1000 varied submissions that carry noise scales (so
  goodput_dp computes real goodput tables), interleaved, median of 7 each after one warm-up
  decision (a live service decides on the same queue again and again);
  ``decision_ratio_goodput_dp_over_elastic_dp_1000_queued`` their ratio (target <= 3).
* ``recovery_s``: ``kill -9`` of a ``malleable serve`` process running 2 jobs -> a new
  service process (cluster start included) has both running again; split into
  ``recovery_to_serving_s`` (process start, lease, fencing and adopting the orphaned cluster)
  and the rest (resuming from the checkpoints). ``jobs_lost`` / ``jobs_duplicated``: of the
  jobs of that run, how many never finished / finished or started more than once per
  service attempt.

Usage: ``python benchmarks/service_bench.py [--latency-jobs 8] [--submissions 2000]``.
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocator.admission import OverflowMode, reallocate  # noqa: E402
from allocator.policies import make_policy  # noqa: E402
from allocator.profiles.io import profile_from_dict  # noqa: E402
from allocator.types import ClusterSnapshot  # noqa: E402
from service.client import ServiceClient  # noqa: E402
from service.feed import StoreFeed  # noqa: E402
from service.jobs.jobspec import spec_from_entry  # noqa: E402
from service.store.records import JobState  # noqa: E402
from service.store import JobStore  # noqa: E402

PROFILE = {
    "workload": "mlp_tiny", "hardware": "bench", "num_params": 6532, "batch_sizes": [8, 16, 32, 64],
    "iter_times_s": [0.004, 0.006, 0.010, 0.018], "max_batch_per_gpu": 64,
    "allreduce": {"latency_s": 0.0005, "seconds_per_param": 1e-9},
}  # fmt: skip


def entry(name: str, samples: int, **kw) -> dict:
    e = {"id": name, "workload": "mlp_tiny", "profile": PROFILE, "samples": samples, "min_batch": 32, "max_batch": 128, "max_gpus": 2}
    e.update(kw)
    return e


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def submit_latency(n_jobs: int, workdir: Path) -> list[float]:
    from deploy.clusters import connect
    from service.runner import Service, ServiceConfig

    url = f"sqlite:///{workdir / 'latency.db'}"
    config = ServiceConfig(store_url=url, checkpoint_root=str(workdir / "ckpt"), interval_s=60.0, react=True, poll_s=0.2, checkpoint_every=100)
    service = Service(config, say=lambda _l: None)
    service.acquire()
    latencies = []
    with connect("local", workers=2) as dask:
        thread = threading.Thread(target=service.run, args=(dask,), kwargs={"cluster_owned": False}, daemon=True)
        thread.start()
        client = ServiceClient(service.store, submitter="bench")
        time.sleep(3.0)  # the service takes up its first poll; the workers import the trainer
        for i in range(n_jobs + 1):
            job = client.submit(entry(f"lat{i}", 4000))
            t_submit = time.time()
            rows = client.wait([job.job_id], timeout_s=120, poll_s=0.05)
            assert rows[0].state is JobState.FINISHED, rows[0]
            start = next(a.time for a in service.store.allocations(job.job_id) if a.kind == "start")
            if i > 0:  # the first job also builds the recipe on each worker: reported apart
                latencies.append(start - t_submit)
            else:
                print(f"first job on fresh workers: {start - t_submit:.2f} s submit -> running")
        service.stop()
        thread.join(timeout=60)
    return latencies


def submissions_per_s(url: str, n: int, async_commit: bool = False) -> float:
    client = ServiceClient(JobStore(url, async_commit_submissions=async_commit), submitter="bench")
    e = entry("s", 1000)
    t0 = time.perf_counter()
    for i in range(n):
        client.submit(e, name=f"s{i}")
    return n / (time.perf_counter() - t0)


def postgres_url() -> str | None:
    import sqlalchemy

    admin = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    name = f"malleable_bench_{os.getpid()}"
    try:
        engine = sqlalchemy.create_engine(admin, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        engine.dispose()
    except Exception as exc:  # noqa: BLE001
        print(f"PostgreSQL not reachable ({type(exc).__name__}): skipped")
        return None
    return admin.rsplit("/", 1)[0] + "/" + name


def drop_postgres(url: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url.rsplit("/", 1)[0] + "/test", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")
    engine.dispose()


def fill_queue(store: JobStore, n: int) -> None:
    """``n`` queued jobs, written in one transaction per 1000 (the figures are about reading them)."""
    from service.store.records import Submission

    e = spec_from_entry(entry("q", 100_000, max_gpus=8, max_batch=512))
    for lo in range(0, n, 1000):
        store.submit_many([Submission(f"q{i}", e, "bench") for i in range(lo, min(n, lo + 1000))])


def steady_poll_ms(store: JobStore, n: int, repeats: int = 50) -> tuple[float, float]:
    """A running service's poll with ``n`` jobs queued and nothing new (what it does every
    poll_s), median of ``repeats``; and its first poll, which reads and parses all ``n``."""
    feed = StoreFeed(store, threading.Event(), poll_s=1e-9, listen=False)
    t0 = time.perf_counter()
    first = feed.poll(0.0)
    load = (time.perf_counter() - t0) * 1000
    assert len(first.jobs) == n, len(first.jobs)
    polls = []
    for i in range(repeats):
        t0 = time.perf_counter()
        arrivals = feed.poll(float(i + 1))
        polls.append((time.perf_counter() - t0) * 1000)
        assert not arrivals.jobs
    return statistics.median(polls), load


def poll_figures(workdir: Path, pg: str | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in (1000, 10_000):
        store = JobStore(f"sqlite:///{workdir / f'poll{n}.db'}")
        fill_queue(store, n)
        poll, load = steady_poll_ms(store, n)
        out[f"poll_ms_{n}_queued"] = round(poll, 3)
        out[f"first_load_ms_{n}_queued"] = round(load, 1)
        print(f"sqlite, {n} queued: a poll with nothing new {poll:.3f} ms; the first poll (read + parse all) {load:.0f} ms")
    if pg is not None:
        store = JobStore(pg)
        fill_queue(store, 10_000)
        for listen in (False, True):
            feed = StoreFeed(store, threading.Event(), poll_s=1e-9, listen=listen)
            feed.poll(0.0)
            polls = []
            for i in range(50):
                t0 = time.perf_counter()
                feed.poll(float(i + 1))
                polls.append((time.perf_counter() - t0) * 1000)
            feed.close()
            key = "poll_ms_10000_queued_postgres" + ("_listen" if listen else "")
            out[key] = round(statistics.median(polls), 3)
            print(f"PostgreSQL, 10000 queued, {'LISTEN/NOTIFY' if listen else 'reading'}: a poll with nothing new {out[key]:.3f} ms")
        store.close()
    return out


def decision_ms(workdir: Path) -> tuple[float, float]:
    url = f"sqlite:///{workdir / 'queue.db'}"
    store = JobStore(url)
    fill_queue(store, 1000)
    arrivals = StoreFeed(store, threading.Event(), poll_s=0.2, listen=False).poll(0.0)
    assert len(arrivals.jobs) == 1000
    policy = make_policy("elastic_dp")
    snapshot = ClusterSnapshot(time=0.0, capacity=64, queued=arrivals.jobs)
    decisions = []
    for _ in range(5):
        t0 = time.perf_counter()
        reallocate(snapshot, policy, OverflowMode.QUEUE, False)
        decisions.append((time.perf_counter() - t0) * 1000)
    return statistics.median(decisions)


DECISION_POLICIES = ("elastic_dp", "goodput_dp")


def decision_ms_by_policy(workdir: Path, repeats: int = 7) -> dict[str, float]:
    """One loop decision (admission + allocation) per policy on 1000 queued jobs, 64 GPUs, interleaved."""
    import numpy as np

    store = JobStore(f"sqlite:///{workdir / 'queue_noise.db'}")
    client = ServiceClient(store, submitter="bench")
    rng = np.random.default_rng(0)
    for i in range(1000):
        lo = int(rng.choice([16, 32, 64]))
        noise = {"fractions": [0, 0.5], "values": [float(rng.uniform(50, 500)), float(rng.uniform(500, 5000))]}
        client.submit(entry(f"n{i}", 100_000, min_batch=lo, max_batch=int(rng.choice([256, 512, 1024])), max_gpus=int(rng.choice([2, 4, 8])), noise_scale=noise), name=f"n{i}")
    arrivals = StoreFeed(store, threading.Event(), poll_s=0.2, listen=False).poll(0.0)
    assert len(arrivals.jobs) == 1000 and all(j.noise_scale is not None for j in arrivals.jobs)
    snapshot = ClusterSnapshot(time=0.0, capacity=64, queued=arrivals.jobs)
    policies = {name: make_policy(name) for name in DECISION_POLICIES}
    times: dict[str, list[float]] = {name: [] for name in policies}
    for name, policy in policies.items():
        reallocate(snapshot, policy, OverflowMode.QUEUE, False)  # warm: the service has decided on this queue before
    for _ in range(repeats):
        for name, policy in policies.items():
            t0 = time.perf_counter()
            reallocate(snapshot, policy, OverflowMode.QUEUE, False)
            times[name].append((time.perf_counter() - t0) * 1000)
    out = {f"decision_ms_{name}_1000_queued": round(statistics.median(t), 2) for name, t in times.items()}
    out["decision_ratio_goodput_dp_over_elastic_dp_1000_queued"] = round(out["decision_ms_goodput_dp_1000_queued"] / out["decision_ms_elastic_dp_1000_queued"], 2)
    return out


class Serve:
    def __init__(self, cwd: Path, env: dict) -> None:
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "flows.commands.cli", "serve"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip()))

    def when(self, text: str, timeout: float = 180.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in self.lines:
                if text in line:
                    return t
            time.sleep(0.05)
        raise TimeoutError(f"service never printed {text!r}: {[l for _, l in self.lines][-10:]}")

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def recovery(workdir: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(
        PYTHONPATH=str(REPO), MALLEABLE_STATE_DIR=str(workdir / "state"), MALLEABLE_WORKERS="2", MALLEABLE_CHECKPOINT_EVERY="50",
        PREFECT_HOME=str(workdir / "prefect"),
    )  # fmt: skip
    url = f"sqlite:///{(workdir / 'state' / 'jobs.db').resolve()}"
    store = JobStore(url)
    client = ServiceClient(store, submitter="bench")
    ids = [client.submit(entry(f"r{i}", 400_000, max_gpus=1)).job_id for i in range(2)]
    first = Serve(workdir, env)
    services = [first]
    try:
        deadline = time.monotonic() + 180
        while not all(store.job(j).samples_done > 40_000 for j in ids):
            if time.monotonic() > deadline:
                raise TimeoutError("jobs made no progress before the crash")
            time.sleep(0.2)
        first.proc.kill()
        t_kill = time.time()
        first.proc.wait()
        second = Serve(workdir, env)
        services.append(second)
        t_serving = second.when("serving")
        while not all(any(a.kind == "start" and a.time > t_kill for a in store.allocations(j)) for j in ids):
            if time.monotonic() > deadline + 180:
                raise TimeoutError("jobs did not resume")
            time.sleep(0.05)
        t_running = max(a.time for j in ids for a in store.allocations(j) if a.kind == "start")
        rows = client.wait(ids, timeout_s=300)
        starts = {j: sum(1 for a in store.allocations(j) if a.kind == "start") for j in ids}
        second.proc.send_signal(signal.SIGTERM)
        second.proc.wait(timeout=60)
    finally:
        for s in services:
            s.kill_group()
    lost = sum(1 for r in rows if r.state is not JobState.FINISHED)
    duplicated = sum(1 for j in ids if starts[j] != 2) + sum(1 for r in rows if r.attempts != 2)
    return {
        "recovery_s": round(t_running - t_kill, 2),
        "recovery_to_serving_s": round(t_serving - t_kill, 2),
        "recovery_resume_s": round(t_running - t_serving, 2),
        "jobs_lost": lost,
        "jobs_duplicated": duplicated,
    }


def double_sigterm(workdir: Path) -> float:
    """A service with a job training gets SIGTERM twice (0.3 s apart): seconds from the first
    to the process's exit; the job must be suspended with a checkpoint."""
    workdir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(PYTHONPATH=str(REPO), MALLEABLE_STATE_DIR=str(workdir / "state"), MALLEABLE_WORKERS="1", MALLEABLE_CHECKPOINT_EVERY="50", PREFECT_HOME=str(workdir / "prefect"))
    store = JobStore(f"sqlite:///{(workdir / 'state' / 'jobs.db').resolve()}")
    job = ServiceClient(store, submitter="bench").submit(entry("long", 5_000_000, max_gpus=1)).job_id
    svc = Serve(workdir, env)
    try:
        deadline = time.monotonic() + 180
        while store.job(job).samples_done < 20_000:
            if time.monotonic() > deadline:
                raise TimeoutError("the job made no progress")
            time.sleep(0.2)
        t0 = time.monotonic()
        svc.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        svc.proc.send_signal(signal.SIGTERM)
        svc.proc.wait(timeout=120)
        seconds = time.monotonic() - t0
    finally:
        svc.kill_group()
    row = store.job(job)
    assert svc.proc.returncode == 0 and row.state is JobState.SUSPENDED, (svc.proc.returncode, row.state, [l for _, l in svc.lines][-5:])
    return round(seconds, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-jobs", type=int, default=8)
    parser.add_argument("--submissions", type=int, default=2000)
    args = parser.parse_args()
    spec_from_entry(entry("check", 1000))
    profile_from_dict(PROFILE)
    out: dict[str, float | int | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rate = submissions_per_s(f"sqlite:///{work / 'submit.db'}", args.submissions)
        out["submissions_per_s"] = round(rate, 1)
        print(f"submissions into sqlite: {rate:.0f}/s ({args.submissions} one-transaction submits)")
        pg = postgres_url()
        pg_poll = postgres_url() if pg is not None else None
        try:
            if pg is not None:
                out["submissions_per_s_postgres"] = round(submissions_per_s(pg, args.submissions), 1)
                out["submissions_per_s_postgres_async_commit"] = round(submissions_per_s(pg, args.submissions, async_commit=True), 1)
                print(f"submissions into PostgreSQL: {out['submissions_per_s_postgres']:.0f}/s, {out['submissions_per_s_postgres_async_commit']:.0f}/s without waiting for each WAL flush")
            out.update(poll_figures(work, pg_poll))
        finally:
            for url in (pg, pg_poll):
                if url is not None:
                    drop_postgres(url)
        decision = decision_ms(work)
        out["decision_ms_1000_queued"] = round(decision, 2)
        print(f"one decision with 1000 queued jobs on 64 GPUs: {decision:.1f} ms")
        out.update(decision_ms_by_policy(work))
        print("one decision per policy, 1000 queued jobs with noise scales, 64 GPUs: " + ", ".join(f"{k} {v}" for k, v in out.items() if k.startswith("decision_ms_") and "ratio" not in k and k != "decision_ms_1000_queued"))
        lat = submit_latency(args.latency_jobs, work)
        out["submit_to_running_p50_s"] = round(statistics.median(lat), 3)
        out["submit_to_running_p95_s"] = round(pct(lat, 0.95), 3)
        out["submit_to_running_max_s"] = round(max(lat), 3)
        print(f"submit -> running over {len(lat)} jobs: p50 {out['submit_to_running_p50_s']} s, p95 {out['submit_to_running_p95_s']} s")
        out["double_sigterm_exit_s"] = double_sigterm(work / "sigterm")
        print(f"two SIGTERMs to a serving process with a running job -> exited (job checkpointed, suspended): {out['double_sigterm_exit_s']} s")
        rec = recovery(work)
        out.update(rec)
        print(
            f"kill -9 -> all jobs running again: {rec['recovery_s']} s ({rec['recovery_to_serving_s']} s to a serving process that adopted the "
            f"orphaned cluster, {rec['recovery_resume_s']} s to resume from checkpoints); lost {rec['jobs_lost']}, duplicated {rec['jobs_duplicated']}"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
