"""The control plane at scale: plan publication and the per-step agreement with 64-1,024 ranks.

What is real: a Dask scheduler in its own process (its CPU is read from /proc), ``H`` Dask
worker processes each standing for a host, the job board (``JobBoard``: plan ``Variable``s,
the published ``Event``s, the latest-version metadata, status), a board per rank writing as that
rank through the fence (start mark and READY from every rank, all at once; rank 0's rendezvous,
status and APPLIED per plan), the rank's ``Courier`` (one per rank, long-polling where
``plan_watcher.watches`` says so or where it leads its host's ``HostShare``), ``PlanSwitch``
(the plan due read from the host's shared memory, else rank 0's store, else the board),
``ProcessGroups.form`` (TCPStore rendezvous through the board) and ``Agreement`` (the async
allreduce of every step, read one step later) over a real gloo group between the hosts. Each
host has a shared-memory directory of its own (they share one machine).

Why the design changed for 1,024 ranks (docs/elastic.md, "Control plane at scale"): the plan due
at a boundary was read by every rank from rank 0's store after rank 0 read the board — half the
p99 — so one rank per host now reads it as it is published and the host's ranks take it from
shared memory; publishing is one scheduler round trip, not three; a fenced write is a scheduler
handler, not ``run_on_scheduler`` (half its scheduler CPU).

What is simulated: a rank is a ``PlanSwitch``, a ``Courier`` and a store connection of its own,
with a thread of its own for the boundaries where it reads a plan (``ranks / H`` per worker
process); its step is a ``sleep(step_ms)`` on the host's clock (no model, no gradient allreduce),
and the ranks of one host add their agreement slots in shared memory before the host's one
allreduce (per-host aggregation, as nccl's hierarchical allreduce does inside a node; on 2 cores
1,024 gloo processes cannot run). The agreement's content is the trainer's: the newest plan
version any rank saw, summed step figures.

Figures per size N (the last line, one JSON object):
  plan_latency_p50_ms_N_ranks / _p99_   from the coordinator's ``publish`` to a rank holding the
                                        plan (``PlanSwitch.due`` returned it), over ranks x plans
  agreement_ms_per_step_N_ranks         mean time a step is blocked by its agreement: the host's
                                        aggregation plus ``Agreement.issue`` (waiting for the previous
                                        step's allreduce and launching this one)
  scheduler_cpu_ms_per_s_per_rank_N_ranks  scheduler CPU ms per wall second, divided by N
  fenced_writes_per_s_N_ranks / fenced_write_p50_ms_ / _p99_   all N ranks' first two writes
                                        (start mark, READY) at once, through the fence
  scheduler_cpu_ms_per_fenced_write_N_ranks  the scheduler's CPU over that burst, per write
  plan_read_own_p99_ms_N_ranks          one rank's own read at a switch (its ``due``): what a rank in a
                                        process of its own pays; plan_read_p99 adds the host's ranks read
                                        one after another on one thread, the simulation's own cost
  plan_latency_own_process_p99_ms_N_ranks  publish -> the rank's host agreed + that rank's own read:
                                        the latency were each rank a process of its own (context only;
                                        the target is on the measured plan_latency_p99)
  plan_boundaries_from_host_share_N_ranks  host x plan boundaries whose plan was in shared memory
  fence_ledger_exact_N_ranks            oracle: the scheduler's ledger and events hold exactly the
                                        writes made (every rank 2, rank 0 more), none refused
  plans_once_N_ranks / same_stop_step_N_ranks  oracles: every rank held every plan exactly once, and
                                        all ranks left on the STOP plan at the same step

Run: nice -n 10 timeout 600 python benchmarks/control_plane_bench.py [--ranks 64,256,1024]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from distributed import Client, Event, get_client, get_worker


def _fail(field: str, value: object, why: str) -> None:
    print(f"control_plane_bench: {field}={value!r}: {why}", file=sys.stderr)
    raise SystemExit(2)


def run_host(board_id: str, host: int, hosts: int, uids: list[str], step_s: float) -> dict:
    """One worker process = one host: its ranks as threads, one agreement allreduce per step."""
    import torch
    import torch.distributed as dist

    from elastic_tasks.board import EventKind, JobBoard, JobStatus, RankEvent
    from elastic_tasks.protocol import PlanKind, TrainConfig
    from elastic_tasks.rank.agreement import Agreement, StepOutcome
    from elastic_tasks.rank.host_share import HostShare, default_root
    from elastic_tasks.rank.plan_switch import PlanSwitch
    from elastic_tasks.rank.plan_watcher import Courier, watches
    from elastic_tasks.rank.process_group import ProcessGroups
    from elastic_tasks.rank.accounting.wall_split import WallTimeline

    torch.set_num_threads(1)
    client = get_client()
    # Every rank writes as itself, through the fence (one check-and-write on the scheduler each).
    boards = [JobBoard(board_id, client, writer=u) for u in uids]
    board = boards[0]
    config = TrainConfig(global_batch=len(uids) * 2, max_steps=10**9, timeout_s=60.0, data_timeout_s=120.0)
    first = board.plan(0, timeout=60.0)
    ranks = [first.members.index(u) for u in uids]
    # The bench's hosts share one machine: each gets a shared-memory root of its own, as a host has.
    share_root = os.path.join(default_root(), f"{board_id}-host{host}")
    os.makedirs(share_root, mode=0o700, exist_ok=True)
    shares = [HostShare(board_id, root=share_root) for _ in uids]
    couriers = [Courier(b, sh) for b, sh in zip(boards, shares)]
    for courier, rank in zip(couriers, ranks):
        courier.watching = watches(rank)
        courier.start()
    switches = [PlanSwitch(b, config, WallTimeline(), sh) for b, sh in zip(boards, shares)]
    for switch in switches:
        switch.adopt(first)
    groups = ProcessGroups(board, "127.0.0.1", "gloo", config)  # host 0's: rank 0 opens the rendezvous
    groups.form(0, host, hosts)
    agreement = Agreement(host, hosts)
    store_at = board.rendezvous(0, timeout=60.0)
    shared: dict = {"agreed": None, "step": 0}
    blocked: list[float] = []

    def agree() -> None:  # the host's agreement: its ranks' slots added here, one allreduce between hosts
        t0 = time.perf_counter()
        seen = max(c.seen_version for c in couriers)  # the host's slot: the newest any local rank saw
        step = shared["step"]
        outcome = StepOutcome(step, 0.0, 0.0, len(uids), 1.0, config.global_batch, 0.1, t0, time.process_time())
        shared["agreed"] = agreement.issue(outcome, seen, None)
        shared["step"] = step + 1
        if host == 0 and shared["agreed"] is not None:  # rank 0's status, pushed by its courier
            couriers[0].status = JobStatus(shared["agreed"].newest_version, step, 0, len(first.members), config.global_batch, 0.0, time.time())
        blocked.append(time.perf_counter() - t0)

    reached: list[tuple[str, int, float, float, float]] = []  # uid, version, held at, agreed at, own read (s)
    stops: dict[str, int] = {}
    lock = threading.Lock()
    # A rank's own thread (the pool's, one per rank) for whatever of the protocol blocks: its
    # connection to the generation's store, as a rank process has (a TCPStore client serialises
    # its calls: ranks sharing one would queue behind each other's waits), and its plan reads.
    pool = ThreadPoolExecutor(max_workers=len(uids))

    def connect(i: int) -> None:
        own = groups.store if ranks[i] == 0 else dist.TCPStore(*store_at, is_master=False, timeout=timedelta(seconds=60))
        switches[i].fan_out_through(own, ranks[i])

    def boundary(i: int, newest: int, step: int, t_known: float) -> bool:
        """Rank ``i`` at a step boundary: the plan due, read as the rank reads it; whether it left."""
        switch = switches[i]
        t0 = time.perf_counter()
        plan = switch.due(newest, step)
        if plan is None:
            return False
        with lock:
            reached.append((uids[i], plan.version, time.time(), t_known, time.perf_counter() - t0))
        switch.adopt(plan)
        if plan.kind == PlanKind.STOP:
            stops[uids[i]] = step
            return True
        if ranks[i] == 0:  # rank 0 reports the switch (RankReporter.switched), once this host's ranks all read it:
            # in its own process it would not hold up the host's other ranks, as it would here
            applied.append(RankEvent(EventKind.APPLIED, uids[i], plan.version, step, world_size=len(first.members)))
        return False

    applied: list = []

    write_ms: list[float] = []

    def arrive(i: int) -> None:
        """A rank's first writes, as ``run_rank`` makes them: its start mark, then READY."""
        for write in (lambda: boards[i].mark_started(uids[i]), lambda: boards[i].post(RankEvent(EventKind.READY, uids[i], 0, 0))):
            t = time.perf_counter()
            write()
            with lock:
                write_ms.append((time.perf_counter() - t) * 1000)

    list(pool.map(connect, range(len(uids))))
    # Every rank of every host writes at once: the burst the fence sees as a job of N ranks starts.
    client.set_metadata([f"malleable-{board_id}-bench-ready", str(host)], True)
    Event(f"malleable-{board_id}-bench-go", client=client).wait(120)
    t_burst = time.time()
    list(pool.map(arrive, range(len(uids))))
    burst = (t_burst, time.time())
    # The host's clock: every rank's step is the same sleep, then the host's agreement (the ranks'
    # gradient allreduce would synchronise them there anyway). A boundary where the agreed version
    # is one the ranks have not read runs every rank's ``due`` on its own thread, at once, as
    # separate rank processes would; elsewhere ``due`` does no I/O and runs here (a rank thread
    # woken per step only measured the 2-core box's thread switching).
    left = False
    from_share = missed = 0
    while not left:
        time.sleep(step_s)  # the step's compute
        agree()
        agreed, step = shared["agreed"], shared["step"]
        t_known = time.time()  # the agreement told the ranks of the version; now they read the plan
        if agreed is not None and agreed.newest_version > switches[0].current.version and shares[0].get(agreed.newest_version) is not None:
            from_share += 1  # in the host's memory already: each rank's ``due`` reads it there, no wait, no I/O to wait on
            left = any([boundary(i, agreed.newest_version, step, t_known) for i in range(len(uids))])
        elif agreed is not None and agreed.newest_version > switches[0].current.version:
            missed += 1
            n_local = len(uids)  # every rank's read to its end: an abandoned map cancels what has not started
            left = any(list(pool.map(boundary, range(n_local), [agreed.newest_version] * n_local, [step] * n_local, [t_known] * n_local)))
        else:
            left = any([boundary(i, switches[i].current.version, step, t_known) for i in range(len(uids))])
        while applied:
            boards[0].post(applied.pop())
    pool.shutdown()
    agreement.settle(None)  # the allreduce in flight, as the trainer drains it before leaving
    for courier in couriers:
        courier.stop()
    groups.drop()
    for courier in couriers:
        courier.join(10)  # its leader's courier removes the host's copies as it ends
    shutil.rmtree(share_root, ignore_errors=True)
    return {"reached": reached, "stops": stops, "blocked_s": blocked, "worker": get_worker().address,
            "write_ms": write_ms, "burst": burst, "from_share": from_share, "missed": missed}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(client: Client, scheduler_pid: int, workers: list[str], n: int, step_s: float, plans: int, every_s: float) -> dict:
    from elastic_tasks.board import EventKind, JobBoard
    from elastic_tasks.protocol import Plan, PlanKind

    board_id = f"cpbench-{n}-{uuid.uuid4().hex[:6]}"
    board = JobBoard(board_id, client)
    board.serve_fenced_writes()
    members = tuple(f"r{i:04d}" for i in range(n))
    board.publish(Plan(0, PlanKind.START, members, n * 2))
    hosts = len(workers)
    futures = [
        client.submit(run_host, board_id, h, hosts, list(members[h::hosts]), step_s, workers=[w], pure=False, key=f"{board_id}-host{h}")
        for h, w in enumerate(workers)
    ]
    while len(client.get_metadata(f"malleable-{board_id}-bench-ready", None) or {}) < hosts:  # every rank connected
        if any(f.status == "error" for f in futures):
            raise futures[0].result()
        time.sleep(0.1)
    writes = 2 * n + 1  # each rank's start mark and READY; rank 0's rendezvous (before them)
    cpu0, t0 = _cpu_s(scheduler_pid), time.monotonic()
    Event(f"malleable-{board_id}-bench-go", client=client).set()
    while sum(w.accepted for w in board.ledger().values()) < writes:
        if any(f.status == "error" for f in futures):
            raise futures[0].result()
        time.sleep(0.05)
    burst_cpu_s = _cpu_s(scheduler_pid) - cpu0
    while (status := board.status()) is None or status.step < 20:  # every host trains: warmed up
        if any(f.status == "error" for f in futures):
            raise futures[0].result()
        time.sleep(0.2)
    cpu0, t0 = _cpu_s(scheduler_pid), time.monotonic()
    published: dict[int, float] = {}
    for v in range(1, plans + 1):
        time.sleep(every_s)
        published[v] = time.time()
        board.publish(Plan(v, PlanKind.BATCH, members, n * (2 + v % 2)))
    time.sleep(every_s)
    cpu_s, wall_s = _cpu_s(scheduler_pid) - cpu0, time.monotonic() - t0
    published[plans + 1] = time.time()
    board.publish(Plan(plans + 1, PlanKind.STOP, (), n * 2))
    results = client.gather(futures)
    ledger = board.ledger()
    events = board.drain(0.0)
    board.forget()
    # Oracles for the fence: every write the ranks made was accepted, each exactly once where the
    # count is known (a rank's start mark and READY; rank 0 also its rendezvous, APPLIED per plan, status).
    ready = sorted(e.uid for e in events if e.kind == EventKind.READY)
    applied = sorted(e.version for e in events if e.kind == EventKind.APPLIED)
    ledger_exact = (
        sorted(ledger) == list(members) and all(w.refused == 0 for w in ledger.values())
        and all(ledger[u].accepted == 2 for u in members[1:]) and ledger[members[0]].accepted >= 3 + plans
        and ready == list(members) and applied == list(range(1, plans + 1))
    )
    if not ledger_exact:
        print(f"control_plane_bench: {n} ranks: fence ledger/events off: {len(ledger)} writers, READY {len(ready)}, "
              f"APPLIED {applied}, rank 0 accepted {ledger.get(members[0])}", file=sys.stderr)
    write_ms = sorted(w for res in results for w in res["write_ms"])
    burst_s = max(r["burst"][1] for r in results) - min(r["burst"][0] for r in results)
    shared = sum(r["from_share"] for r in results)
    missed = sum(r["missed"] for r in results)
    reached = [r for res in results for r in res["reached"]]
    latencies = sorted((t - published[v]) * 1000 for _, v, t, _, _ in reached)
    reads = sorted((t - known) * 1000 for _, _, t, known, _ in reached)
    agreed = sorted((known - published[v]) * 1000 for _, v, _, known, _ in reached)
    own_reads = sorted(own * 1000 for *_, own in reached)  # one rank's own ``due`` at the switch
    # As if each rank were a process of its own: its host learned the agreed version, then it read.
    own_latencies = sorted((known - published[v] + own) * 1000 for _, v, _, known, own in reached)
    counts: dict[tuple[str, int], int] = {}
    for uid, v, *_ in reached:
        counts[(uid, v)] = counts.get((uid, v), 0) + 1
    once = all(counts.get((u, v)) == 1 for u in members for v in published) and len(counts) == len(members) * len(published)
    stops = {s for res in results for s in res["stops"].values()}
    if not once or len(stops) != 1:  # say what broke: versions skipped or repeated, stop steps
        missing = sorted({v for u in members for v in published if counts.get((u, v)) != 1})
        print(f"control_plane_bench: {n} ranks: versions not held exactly once by every rank: {missing}; "
              f"stop steps {sorted(stops)}; ranks stopped {sum(len(res['stops']) for res in results)}", file=sys.stderr)
    blocked = [b * 1000 for res in results for b in res["blocked_s"]]
    return {
        f"plan_latency_p50_ms_{n}_ranks": round(_quantile(latencies, 0.5), 1),
        f"plan_latency_p99_ms_{n}_ranks": round(_quantile(latencies, 0.99), 1),
        f"plan_agreed_p99_ms_{n}_ranks": round(_quantile(agreed, 0.99), 1),  # publish -> the agreement told the rank
        f"plan_read_p99_ms_{n}_ranks": round(_quantile(reads, 0.99), 1),  # -> the rank held the plan
        f"agreement_ms_per_step_{n}_ranks": round(statistics.fmean(blocked), 3),
        f"agreement_p99_ms_{n}_ranks": round(_quantile(sorted(blocked), 0.99), 3),
        f"scheduler_cpu_ms_per_s_per_rank_{n}_ranks": round(cpu_s * 1000 / wall_s / n, 4),
        f"scheduler_cpu_share_{n}_ranks": round(cpu_s / wall_s, 3),
        f"plan_read_own_p99_ms_{n}_ranks": round(_quantile(own_reads, 0.99), 2),
        f"plan_latency_own_process_p99_ms_{n}_ranks": round(_quantile(own_latencies, 0.99), 1),
        f"fenced_writes_per_s_{n}_ranks": round(2 * n / burst_s, 1),  # all ranks' first writes at once
        f"fenced_write_p50_ms_{n}_ranks": round(_quantile(write_ms, 0.5), 2),
        f"fenced_write_p99_ms_{n}_ranks": round(_quantile(write_ms, 0.99), 2),
        f"scheduler_cpu_ms_per_fenced_write_{n}_ranks": round(burst_cpu_s * 1000 / writes, 4),
        f"plan_boundaries_from_host_share_{n}_ranks": f"{shared}/{shared + missed}",
        f"fence_ledger_exact_{n}_ranks": ledger_exact,
        f"plans_once_{n}_ranks": once,
        f"same_stop_step_{n}_ranks": len(stops) == 1 and sum(len(res["stops"]) for res in results) == n,
        f"steps_{n}_ranks": max(stops) if stops else 0,
    }


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64,256,1024", help="comma-separated rank counts")
    ap.add_argument("--hosts", type=int, default=4, help="worker processes, each a host")
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--plans", type=int, default=6, help="plans published per size (then a STOP)")
    ap.add_argument("--plan-every-s", type=float, default=1.5)
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.ranks.split(",")]
    except ValueError:
        _fail("--ranks", args.ranks, "expected comma-separated integers")
    if not sizes or any(n < 1 for n in sizes):
        _fail("--ranks", args.ranks, "every size must be >= 1")
    if not 1 <= args.hosts <= min(sizes):
        _fail("--hosts", args.hosts, f"must be in [1, {min(sizes)}]")
    if not args.step_ms > 0:
        _fail("--step-ms", args.step_ms, "must be > 0")
    if args.plans < 1:
        _fail("--plans", args.plans, "must be >= 1")
    if not args.plan_every_s > 0:
        _fail("--plan-every-s", args.plan_every_s, "must be > 0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` still tears the cluster down
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", ":0", "--no-show"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(args.hosts):
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--no-nanny", "--nthreads", "1",
                                           "--dashboard-address", ":0", "--host", "127.0.0.1"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        figures: dict = {"bench": "control_plane", "hosts": args.hosts, "step_ms": args.step_ms, "plans": args.plans,
                         "cpus": os.cpu_count(), "load_avg_1m_start": round(os.getloadavg()[0], 1),
                         "real": "Dask scheduler process, JobBoard, a fenced board per rank (start mark, READY, APPLIED, status, rendezvous), "
                                 "Courier and HostShare per rank (a shared-memory directory per host), PlanSwitch per rank, "
                                 "ProcessGroups.form, Agreement over gloo between hosts",
                         "simulated": "ranks are threads (ranks/hosts per worker process); a step is a sleep; ranks of a host add "
                                      "their agreement slots in memory before the host's allreduce; a host's ranks read "
                                      "a plan from its shared memory one after another on one thread"}
        with Client(address, timeout=60) as client:
            client.wait_for_workers(args.hosts, timeout=120)
            workers = sorted(client.scheduler_info()["workers"])
            for n in sizes:
                t = time.monotonic()
                figures.update(measure(client, procs[0].pid, workers, n, args.step_ms / 1000, args.plans, args.plan_every_s))
                figures[f"wall_s_{n}_ranks"] = round(time.monotonic() - t, 1)
                print(json.dumps({k: v for k, v in figures.items() if f"_{n}_" in k}), file=sys.stderr, flush=True)
        figures["load_avg_1m_end"] = round(os.getloadavg()[0], 1)  # a shared box: the figures move with it
        if "plan_latency_p99_ms_1024_ranks" in figures and "agreement_ms_per_step_256_ranks" in figures:
            figures["targets_met"] = figures["plan_latency_p99_ms_1024_ranks"] <= 500 and figures["agreement_ms_per_step_256_ranks"] <= 5
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
