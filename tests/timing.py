"""Per-test wall and CPU seconds, for finding where the suite's time goes.

``MALLEABLE_TEST_TIMES=FILE pytest ...`` appends one JSON line per test to FILE: its node id,
the wall seconds of setup + call + teardown, and the CPU seconds the test process and every
process under it used meanwhile (Dask workers, servers, CLIs). Wall time alone misleads on a
shared box: a test waiting on a server and a test computing both look slow under load, and
only the second one competes for the cores a parallel run shares. A test whose CPU seconds are
far below its wall seconds on an idle box waits (on timeouts, polls, start-ups); close to it,
it computes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest


def _tree_cpu_s() -> float:
    """CPU seconds of this process, its reaped children and every live descendant."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:
            continue  # gone between the listing and the read
        total += c.user + c.system
    return total


class TimesRecorder:
    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        wall0, cpu0 = time.monotonic(), _tree_cpu_s()
        yield
        record = {
            "test": item.nodeid,
            "wall_s": round(time.monotonic() - wall0, 3),
            "cpu_s": round(max(0.0, _tree_cpu_s() - cpu0), 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }
        with self.path.open("a") as f:  # one short append per test: workers' lines do not interleave
            f.write(json.dumps(record) + "\n")


def register(config: pytest.Config) -> None:
    path = os.environ.get("MALLEABLE_TEST_TIMES")
    if path:
        config.pluginmanager.register(TimesRecorder(Path(path).resolve()), "malleable-test-times")
