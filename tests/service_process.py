"""A real `malleable serve` for system tests: the process with its output collected, its
environment (a state directory in the test's tmp_path, 2 workers, a 5 s interval), a profile that
makes mlp_tiny compute-heavy, and a wait that prints the store and the services' logs on failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from service.store import JobStore

REPO = Path(__file__).resolve().parents[1]
# A compute-heavy profile for mlp_tiny (steps far longer than an allreduce), so that the policy
# gives a lone job both GPUs and has something to take back when a second job arrives.
PROFILE = {
    "workload": "mlp_tiny", "hardware": "test", "num_params": 6532, "batch_sizes": [8, 16, 32, 64],
    "iter_times_s": [0.004, 0.006, 0.010, 0.018], "max_batch_per_gpu": 64,
    "allreduce": {"latency_s": 0.0005, "seconds_per_param": 1e-9},
}  # fmt: skip


def entry(job_id: str, samples: int, **kw) -> dict:
    e = {"id": job_id, "workload": "mlp_tiny", "profile": PROFILE, "samples": samples, "min_batch": 32, "max_batch": 128, "max_gpus": 2}
    e.update(kw)
    return e


class ServiceProcess:
    """`malleable serve` in its own session (signals reach only it), its output collected."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flows.commands.cli", "serve"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self._collect()

    def _collect(self) -> None:
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                time.sleep(0.2)
                raise AssertionError(f"service exited {self.proc.returncode} before {text!r}:\n{self.output()}")
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} within {timeout} s:\n{self.output()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return rc

    def kill_tree(self) -> None:
        """Clean-up after a test: the service and whatever of its cluster is left. The cluster's
        processes lead process groups of their own (so a terminal's Ctrl-C cannot kill them under
        the service's clean-up): kill them by ancestry, found before the service dies."""
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                child.kill()
        except psutil.NoSuchProcess:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


RUNNING_SERVICES: list[ServiceProcess] = []


def wait_until(predicate, timeout: float, what: str, store: JobStore, services: list | None = None):
    """``predicate``'s first truthy value within ``timeout``; else fail with the store's jobs and the
    services' output (``services``: those to show, default every one this module started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    rows = "\n".join(
        f"{r.id} {r.name} {r.state.value} gpus={r.gpus} {r.samples_done:.0f}/{r.total_samples} attempts={r.attempts} err={r.error} "
        f"allocations={[(a.kind, a.gpus, a.batch) for a in store.allocations(r.id)]}"
        for r in store.jobs()
    )
    logs = "\n".join(f"--- service {i} ---\n{svc.output()[-4000:]}" for i, svc in enumerate(RUNNING_SERVICES if services is None else services))
    raise AssertionError(f"timed out waiting for {what}; jobs:\n{rows}\n{logs}")


@pytest.fixture
def service_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(
        PYTHONPATH=str(REPO),
        MALLEABLE_STATE_DIR=str(tmp_path / "state"),
        MALLEABLE_WORKERS="2",
        MALLEABLE_INTERVAL_S="5",
        MALLEABLE_CHECKPOINT_EVERY="50",
        MALLEABLE_SERVICE_POLL_S="0.2",
        PREFECT_HOME=str(tmp_path / "prefect"),  # a flow run's ephemeral API keeps its database here
    )
    started: list[ServiceProcess] = []

    def start() -> ServiceProcess:
        svc = ServiceProcess(tmp_path, env)
        started.append(svc)
        RUNNING_SERVICES.append(svc)
        return svc

    store_url = f"sqlite:///{(tmp_path / 'state' / 'jobs.db').resolve()}"
    yield start, store_url, env, tmp_path
    for svc in started:
        svc.kill_tree()
    RUNNING_SERVICES.clear()
