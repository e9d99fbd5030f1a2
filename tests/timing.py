"""Per-test wall and CPU seconds, for finding where the suite's time goes.

``MALLEABLE_TEST_TIMES=FILE pytest ...`` appends one JSON line per test to FILE: its node id,
the wall seconds of setup + call + teardown, and the CPU seconds the test process and every
process under it used meanwhile (Dask workers, servers, CLIs). Wall time alone misleads on a
shared box: a test waiting on a server and a test computing both look slow under load, and
only the second one competes for the cores a parallel run shares. A test whose CPU seconds are
far below its wall seconds on an idle box waits (on timeouts, polls, start-ups); close to it,
it computes.

``python -m tests.timing FILE`` prints the slowest tests and each file's totals: with
``--dist loadfile`` a file runs whole on one worker, so the longest file bounds a parallel run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil
import pytest


def tree_cpu_s() -> float:
    """CPU seconds of this process, every live descendant and the children each of them reaped.

    A live descendant's reaped children count too: a forkserver's forked ranks, a Dask nanny's
    restarted worker process are gone by the test's end, their CPU only in their parent's."""
    total = 0.0
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            c = proc.cpu_times()
        except psutil.Error:
            continue  # gone between the listing and the read
        total += c.user + c.system + c.children_user + c.children_system
    return total


class TimesRecorder:
    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        wall0, cpu0 = time.monotonic(), tree_cpu_s()
        yield
        record = {
            "test": item.nodeid,
            "wall_s": round(time.monotonic() - wall0, 3),
            "cpu_s": round(max(0.0, tree_cpu_s() - cpu0), 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "ended_at": round(time.time(), 3),  # lays the tests on one timeline beside a /proc sampler's
        }
        with self.path.open("a") as f:  # one short append per test: workers' lines do not interleave
            f.write(json.dumps(record) + "\n")


def register(config: pytest.Config) -> None:
    path = os.environ.get("MALLEABLE_TEST_TIMES")
    if path:
        config.pluginmanager.register(TimesRecorder(Path(path).resolve()), "malleable-test-times")


def summary(lines: list[str], top: int = 20) -> str:
    records = [json.loads(line) for line in lines if line.strip()]
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in records:
        f = files[r["test"].split("::")[0]]
        f[0] += r["wall_s"]
        f[1] += r["cpu_s"]
        f[2] += 1
    wall, cpu = sum(r["wall_s"] for r in records), sum(r["cpu_s"] for r in records)
    out = [f"{len(records)} tests: {wall:.0f} s wall, {cpu:.0f} s CPU in all", "", "wall_s  cpu_s  test"]
    out += [f"{r['wall_s']:6.1f} {r['cpu_s']:6.1f}  {r['test']}" for r in sorted(records, key=lambda r: -r["wall_s"])[:top]]
    out += ["", "wall_s  cpu_s  tests  file"]
    out += [f"{w:6.1f} {c:6.1f}  {n:5d}  {name}" for name, (w, c, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]]
    return "\n".join(out)


def file_seconds(lines: list[str]) -> dict[str, float]:
    """Each file's wall seconds (setup + call + teardown of its tests), the parallel run's order key."""
    seconds: dict[str, float] = defaultdict(float)
    for line in lines:
        if line.strip():
            record = json.loads(line)
            seconds[record["test"].split("::")[0]] += record["wall_s"]
    return {name: round(s, 1) for name, s in sorted(seconds.items())}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.timing", description="Where the suite's time goes, from MALLEABLE_TEST_TIMES=FILE.")
    parser.add_argument("times", type=Path, help="the JSON-lines file a timed run wrote")
    parser.add_argument("top", type=int, nargs="?", default=20, help="how many tests and files to list")
    parser.add_argument("--baseline", type=Path, help="also write each file's seconds here (tests/file_seconds.json orders a fresh clone's run)")
    args = parser.parse_args(argv)
    lines = args.times.read_text().splitlines()
    print(summary(lines, top=args.top))
    if args.baseline is not None:
        args.baseline.write_text(json.dumps(file_seconds(lines), indent=0) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
