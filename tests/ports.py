"""A port for a server a test starts later, that no other process is handed meanwhile.

A port found by binding port 0 and closing the socket is free only for the moment: it comes from
the kernel's ephemeral range, and every process binding port 0 meanwhile (Dask's schedulers,
workers and nannies, Prefect and MLflow servers, each test process's clients) draws from the
same range. A test that points a client at "MLflow, down for now" on such a port once met a
Dask worker's HTTP server there (``404: Not Found`` from Tornado, not a refused connection), and
its flow failed. A port below the ephemeral range is only ever taken by a process that names it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # above the well-known and the commonly configured service ports


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for port-0 binds (Linux; elsewhere IANA's 49152-65535)."""
    try:
        low, high = map(int, EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 49152, 65535
    return low, high


def unclaimed_port(host: str = "127.0.0.1") -> int:
    """A port free now on ``host`` and outside the ephemeral range (random, so that parallel test
    processes rarely try the same one; checked by binding it)."""
    low, _ = ephemeral_range()
    candidates = list(range(LOWEST, low))
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {LOWEST} and {low} on {host}")
