"""N "hosts" as Linux network namespaces on one bridge, each running the deployment's own worker command.

Layout (addresses exist only inside the namespaces this creates; the root namespace's
interfaces and routes are never touched):

* ``<prefix>-br``: a namespace holding only the bridge ``br0`` and each host's cable end ``c<i>``;
* ``<prefix>-h<i>``: host i, its end of the cable named ``eth0`` with ``10.213.0.<10+i>/24``;
  host 0 runs the Dask scheduler (and whatever drives the job), hosts 1.. run workers.

Faults: ``cut(i)`` sets host i's cable end in the bridge namespace down (the host sees no
carrier; its peers get no answer at all: a silent partition), ``heal(i)`` brings it back;
``freeze(i)``/``thaw(i)`` SIGSTOP/SIGCONT every process the harness started on host i.

Teardown always runs (``close``, the context manager, and an ``atexit`` hook): process groups
killed, namespaces deleted (deleting a namespace deletes the veth ends inside it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field

SUBNET = "10.213.0"
SCHEDULER_PORT = 8786
# The worker command docs/deploy.md gives for an existing cluster (``MALLEABLE_CLUSTER=address``),
# with the variables it suggests adding: no statistical profiler, a 500 ms event-loop tick (each
# idle Dask server otherwise wakes every 20 ms; the Kubernetes pods set them too).
WORKER_ARGS = ("--nthreads", "1", "--memory-limit", "0", "--resources", "GPU=1", "--no-dashboard")
QUIET_TICK_ENV = {"DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "500ms"}
WORKER_ENV = {"DASK_DISTRIBUTED__WORKER__DAEMON": "False", "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False", **QUIET_TICK_ENV}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _exit_on_term(signum, frame) -> None:  # noqa: ANN001
    raise SystemExit(128 + signum)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (one line), or None."""
    if shutil.which("ip") is None:
        return "network namespaces unavailable: no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces unavailable: not root"
    probe = f"m33probe-{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"network namespaces unavailable: `ip netns add` failed: {made.stderr.strip().splitlines()[-1] if made.stderr.strip() else made.returncode}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Hosts:
    """``n`` hosts; host 0 is the scheduler's. Use as a context manager."""

    n: int
    log_dir: str | None = None  # where each worker's output goes (None: discarded)
    prefix: str = field(default_factory=lambda: f"m33{uuid.uuid4().hex[:5]}")
    procs: dict[int, list[subprocess.Popen]] = field(default_factory=dict)
    _made: list[str] = field(default_factory=list)

    def ns(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}-br"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{10 + i}"

    @property
    def scheduler(self) -> str:
        return f"tcp://{self.address(0)}:{SCHEDULER_PORT}"

    def __enter__(self) -> Hosts:
        atexit.register(self.close)
        # atexit does not run on SIGTERM (a CI step's timeout): make it an exit, so finally/close run.
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_term)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        br = self.bridge_ns
        _ip("netns", "add", br)
        self._made.append(br)
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _ip("-n", br, "link", "set", "br0", "up")
        for i in range(self.n):
            ns = self.ns(i)
            _ip("netns", "add", ns)
            self._made.append(ns)
            # Made inside the host's namespace, so no name ever appears in the root namespace.
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"c{i}", "netns", br)
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", br, "link", "set", f"c{i}", "master", "br0")
            _ip("-n", br, "link", "set", f"c{i}", "up")

    def popen(self, i: int, argv: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` on host i, in a process group of its own (so faults and teardown reach its children)."""
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(i), *argv], env=full_env, start_new_session=True, **kw)
        self.procs.setdefault(i, []).append(proc)
        return proc

    def start_scheduler(self) -> subprocess.Popen:
        dask = os.path.join(os.path.dirname(sys.executable), "dask")
        return self.popen(0, [dask, "scheduler", "--host", self.address(0), "--port", str(SCHEDULER_PORT), "--no-dashboard"], env=QUIET_TICK_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start_worker(self, i: int, env: dict[str, str] | None = None) -> subprocess.Popen:
        dask = os.path.join(os.path.dirname(sys.executable), "dask")
        argv, full_env = [dask, "worker", self.scheduler, *WORKER_ARGS], {**WORKER_ENV, **(env or {})}
        if self.log_dir is None:
            return self.popen(i, argv, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Dask's own lines, dated: when a worker started, registered, lost its scheduler.
        with open(os.path.join(self.log_dir, f"worker-h{i}-{len(self.procs.get(i, []))}.log"), "w") as out:
            return self.popen(i, argv, env=full_env, stdout=out, stderr=out)

    def host_of(self, address: str) -> int:
        """The host index of a Dask address ``tcp://10.213.0.x:port``."""
        ip = address.split("://")[-1].rsplit(":", 1)[0]
        return int(ip.rsplit(".", 1)[1]) - 10

    def cut(self, i: int) -> None:
        _ip("-n", self.bridge_ns, "link", "set", f"c{i}", "down")

    def heal(self, i: int) -> None:
        _ip("-n", self.bridge_ns, "link", "set", f"c{i}", "up")

    def _signal(self, i: int, sig: int) -> None:
        for proc in self.procs.get(i, []):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

    def freeze(self, i: int) -> None:
        self._signal(i, signal.SIGSTOP)

    def thaw(self, i: int) -> None:
        self._signal(i, signal.SIGCONT)

    def close(self) -> None:
        for i in list(self.procs):
            self._signal(i, signal.SIGCONT)  # a stopped process dies of SIGKILL, but its group may hold stopped children
            self._signal(i, signal.SIGKILL)
            for proc in self.procs[i]:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        self.procs.clear()
        while self._made:
            ns = self._made.pop()
            # Anything still inside (a child that left its process group) dies with the namespace.
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", ns, check=False)
        try:
            atexit.unregister(self.close)
        except Exception:
            pass
