"""The README's test command runs in parallel, and never more processes than asked for.

Real pytest processes on a project made of this suite's conftest and a probe file: the chosen
number of workers runs it, a worker never starts workers of its own (counted as the distinct
worker ids the probe's tests saw), a named path runs serially, a bad worker count is one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")
PROCESS_COSTS = CONFTEST.with_name("process_costs.py")  # the conftest's plugin, copied beside it
ROOT = CONFTEST.parents[1]
# The probes need no Hypothesis: its plugin's import is two thirds of each pytest process's start-up
# CPU (~1 s of ~1.5 s), and this file starts 14 of them (workers included: they inherit the option).
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")

PROBE = '''
import json
import os

def test_a(): open(os.environ["SEEN"] + "/a-" + os.environ.get("PYTEST_XDIST_WORKER", "main"), "w").close()
def test_b(): open(os.environ["SEEN"] + "/b-" + os.environ.get("PYTEST_XDIST_WORKER", "main"), "w").close()
'''


def _pytest(project: Path, *args: str, workers: str | None) -> tuple[subprocess.CompletedProcess, set[str]]:
    seen = project.parent / f"seen-{workers}-{len(args)}"
    seen.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MALLEABLE_TEST_"))}
    env["SEEN"] = str(seen)
    if workers is not None:
        env["MALLEABLE_TEST_WORKERS"] = workers
    done = subprocess.run([sys.executable, "-m", "pytest", *NO_HYPOTHESIS, "-p", "no:cacheprovider", *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    return done, {p.name.split("-", 1)[1] for p in seen.iterdir()}


def test_workers_as_chosen_none_nested_and_named_paths_serial(tmp_path):
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    (project / "tests" / "conftest.py").write_text(CONFTEST.read_text())
    (project / "tests" / "process_costs.py").write_text(PROCESS_COSTS.read_text())
    (project / "tests" / "test_probe.py").write_text(PROBE)

    default, ids = _pytest(project, workers=None)  # the README's form: no paths
    n = int(re.search(r"^DEFAULT_WORKERS = (\d+)$", CONFTEST.read_text(), flags=re.M).group(1))
    assert n > 1 and default.returncode == 0 and f"{n} workers" in default.stdout, default.stdout[-2000:] + default.stderr[-2000:]
    # Whole files per worker: both tests in one worker, and only the default's workers exist at all.
    assert len(ids) == 1 and ids <= {f"gw{i}" for i in range(n)}, ids
    two, ids = _pytest(project, workers="2")
    assert two.returncode == 0 and "2 workers" in two.stdout and len(ids) == 1 and ids <= {"gw0", "gw1"}, (two.stdout[-2000:], ids)
    named, ids = _pytest(project, "tests/test_probe.py", workers=None)
    assert named.returncode == 0 and "created:" not in named.stdout and ids == {"main"}, named.stdout[-2000:]
    serial, ids = _pytest(project, workers="0")
    assert serial.returncode == 0 and ids == {"main"}, serial.stdout[-2000:]
    bad, _ = _pytest(project, workers="many")
    assert bad.returncode != 0 and "MALLEABLE_TEST_WORKERS='many'" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-2000:]


ORDER_PROBE = '''
import os, pytest

def _ran(name): open(os.environ["SEEN"] + "/order", "a").write(name + "\\n")

{marks}
def test_{name}_{i}(): _ran("{name}")
'''


def test_parallel_order_is_longest_file_first_by_the_last_run_and_slow_files_before_it_is_known(tmp_path):
    # One worker, so the order the queue gave is the order seen. xdist on its own would run the
    # three-test file first (it queues files by their number of tests).
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\ntestpaths = tests\nmarkers =\n    slow: slow\n")
    (project / "tests" / "conftest.py").write_text(CONFTEST.read_text())
    (project / "tests" / "process_costs.py").write_text(PROCESS_COSTS.read_text())
    (project / "tests" / "test_many.py").write_text("".join(ORDER_PROBE.format(marks="", name="many", i=i) for i in range(3)))
    (project / "tests" / "test_one.py").write_text(ORDER_PROBE.format(marks="@pytest.mark.slow", name="one", i=0))

    def order(*args: str) -> list[str]:
        seen = tmp_path / f"seen-{len(list(tmp_path.iterdir()))}"
        seen.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MALLEABLE_TEST_"))}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *NO_HYPOTHESIS, *args], cwd=project, env={**env, "SEEN": str(seen), "MALLEABLE_TEST_WORKERS": "1"}, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return [line for line in (seen / "order").read_text().splitlines()]

    assert order("-p", "no:cacheprovider") == ["one", "many", "many", "many"]  # nothing known: slow first
    # A fresh clone (no cache) orders by the committed baseline.
    (project / "tests" / "file_seconds.json").write_text(json.dumps({"tests/test_many.py": 40.0, "tests/test_one.py": 2.0}))
    assert order("-p", "no:cacheprovider") == ["many", "many", "many", "one"]
    cache = project / ".pytest_cache" / "v" / "malleable" / "file_seconds"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"tests/test_many.py": 50.0, "tests/test_one.py": 1.0}))
    assert order() == ["many", "many", "many", "one"]  # the last run's lengths, longest first
    recorded = json.loads(cache.read_text())  # ... and this run's lengths replace them
    assert set(recorded) == {"tests/test_many.py", "tests/test_one.py"} and recorded["tests/test_many.py"] < 50.0, recorded


def test_the_baseline_is_each_files_wall_seconds_summed_from_a_timed_run(tmp_path):
    times = tmp_path / "times.jsonl"
    rows = [("tests/test_x.py::a", 1.25), ("tests/test_y.py::b[1]", 4.0), ("tests/test_x.py::c", 2.5)]
    times.write_text("".join(json.dumps({"test": t, "wall_s": w, "cpu_s": w / 2, "worker": "gw0"}) + "\n" for t, w in rows))
    out = tmp_path / "file_seconds.json"
    done = subprocess.run([sys.executable, "-m", "tests.timing", str(times), "--baseline", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == {"tests/test_x.py": 3.8, "tests/test_y.py": 4.0}  # 1.25 + 2.5, rounded to 0.1
    assert "3 tests: 8 s wall" in done.stdout
