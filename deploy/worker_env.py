"""What the processes that run submitted code may see of the service's environment: nothing secret.

A Dask worker runs whatever module a submitter named; every process it can reach on the
host is readable to it as far as the kernel allows. Three doors, each closed here:

* **Inheritance.** A child process starts with its parent's C-level environment. The workers
  of a local cluster (``dask spec`` subprocesses, or a nanny's spawned child) would start with
  ``MALLEABLE_JOB_STORE`` and every other credential of the service. ``worker_environ`` is the
  environment they get instead: the service's, less every secret (``is_secret``).
* **The C environment of this process.** ``conceal_secrets`` removes the secrets from it
  (``os.unsetenv``), so that a child started without an explicit environment (multiprocessing's
  spawn, a nanny restarting its worker) inherits none. Python's ``os.environ`` keeps them: the
  settings and MLflow read them there.
* **/proc/<pid>/environ.** The kernel shows the environment block the process started with,
  whatever it unset since; any process of the same user (or root) reads it. ``conceal_secrets``
  overwrites the secrets' values in that block, in place, as ``setproctitle`` does for argv.

What this does not close: a process of the same user can still read this process's memory
through ``/proc/<pid>/mem`` or ptrace where the kernel allows (``kernel.yama.ptrace_scope`` 0,
or root). A boundary that holds against hostile code on one host needs the workers under
another user id (docs/service.md, "Trust boundary"); on Kubernetes the GPU pods never get the
store's Secret at all (deploy/k8s/service.yaml mounts it in the service's pod only).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# The service's own credentials: the job store (write and cancel anyone's jobs), the tracking
# server, Prefect's API, PostgreSQL's client-side password. No rank needs any of them: ranks
# report to the service through Dask, never to the store or MLflow.
SECRET_NAMES = frozenset(
    {
        "MALLEABLE_JOB_STORE",
        "MALLEABLE_TRACKING_URI",
        "MLFLOW_TRACKING_URI",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN",
        "MLFLOW_TRACKING_CLIENT_CERT_PATH",
        "PREFECT_API_KEY",
        "PREFECT_API_AUTH_STRING",
        "PREFECT_API_DATABASE_CONNECTION_URL",
        "PREFECT_SERVER_DATABASE_CONNECTION_URL",
        "PGPASSWORD",
        "DATABASE_URL",
    }
)
# Any value holding scheme://user:password@… is a credential whatever its variable is called.
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@")


def is_secret(name: str, value: str) -> bool:
    """A variable no process running submitted code may see."""
    return name in SECRET_NAMES or bool(_URL_WITH_PASSWORD.search(value))


def worker_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) without its secrets: what a worker starts with.

    Object-store credentials for checkpoints (``AWS_*``, …) pass: ranks write checkpoints.
    """
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items() if not is_secret(name, value)}


def conceal_secrets() -> tuple[str, ...]:
    """Remove this process's secrets from its C environment and from ``/proc/self/environ``;
    ``os.environ`` keeps them for this process's own readers. Returns the names concealed.

    Idempotent and cheap; called as the CLI starts and before any local cluster starts, so
    no child of this process inherits a secret however it is started.
    """
    names = tuple(sorted(name for name, value in os.environ.items() if is_secret(name, value)))
    for name in names:
        os.unsetenv(name)  # the C environ only: os.environ (a copy made at start) keeps the value
    if names:
        _blank_initial_block({name.encode() for name in names})
    return names


def _blank_initial_block(names: set[bytes]) -> None:
    """Overwrite, in this process's memory, the values of ``names`` in the environment block the
    kernel shows as ``/proc/self/environ`` (between ``env_start`` and ``env_end`` of
    ``/proc/self/stat``). Best effort: a kernel or platform without that file is left as it is."""
    try:
        import ctypes

        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        # Fields 50 and 51 of proc(5) (env_start, env_end), counted from field 3 after the ")".
        start, end = int(fields[47]), int(fields[48])
        if not (0 < start < end):
            return
        block = ctypes.string_at(start, end - start)
    except (OSError, ValueError, IndexError):
        return
    offset = 0
    for entry in block.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name in names and value:
            # Same length, so later entries keep their addresses (glibc's environ may point at them).
            ctypes.memset(start + offset + len(name) + 1, ord("*"), len(value))
        offset += len(entry) + 1
