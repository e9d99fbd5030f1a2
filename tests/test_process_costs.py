"""The suite's own process costs (tests/process_costs.py): the project's bytecode is written once
for every test process, and a test process's collected heap is out of the cyclic collector's walk."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys

from tests.process_costs import ROOT, compile_project, project_packages


def test_the_project_is_compiled_once_for_processes_that_may_not_write_bytecode(tmp_path):
    for package, modules in {"alpha": ["__init__.py", "one.py"], "beta": ["__init__.py", "sub/__init__.py", "sub/two.py"]}.items():
        for module in modules:
            (tmp_path / package / module).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / package / module).write_text("VALUE = 1\n")
    (tmp_path / "docs").mkdir()  # a folder, not a package
    (tmp_path / "docs" / "build.py").write_text("VALUE = 2\n")
    (tmp_path / "setup_helper.py").write_text("VALUE = 3\n")  # a top-level script, not a package

    assert [p.name for p in project_packages(tmp_path)] == ["alpha", "beta"]
    assert compile_project(tmp_path)
    compiled = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.py") if os.path.exists(importlib.util.cache_from_source(str(p)))}
    assert compiled == {"alpha/__init__.py", "alpha/one.py", "beta/__init__.py", "beta/sub/__init__.py", "beta/sub/two.py"}

    # A process that may not write bytecode (-B) runs what was compiled, not the source: a source
    # changed behind the cache's back (same size, same mtime) still imports as it was compiled.
    two = tmp_path / "beta" / "sub" / "two.py"
    stat = two.stat()
    two.write_text("VALUE = 9\n")
    os.utime(two, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    done = subprocess.run([sys.executable, "-B", "-c", "import beta.sub.two as m; print(m.VALUE)"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_the_real_project_packages_are_the_repositorys_packages():
    expected = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert [p.name for p in project_packages()] == expected
    assert {"allocator", "deploy", "elastic_tasks", "flows", "tests"} <= set(expected)


def test_a_test_process_runs_with_its_collected_heap_frozen():
    assert gc.get_freeze_count() > 10_000


PROBE = '''
import atexit
import os


class TornDown:
    def __del__(self, open=open, path=os.environ["MARK"] + "-teardown"):  # the interpreter's teardown frees it
        open(path, "w").close()


HELD = TornDown()


def test_registers_an_exit_handler():
    atexit.register(lambda: open(os.environ["MARK"], "w").write("ran"))


def test_that_may_fail():
    assert os.environ.get("FAIL") != "1"
'''


def test_a_parallel_test_process_reports_runs_its_exit_handlers_and_leaves(tmp_path):
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    for support in ("conftest.py", "process_costs.py"):
        (project / "tests" / support).write_text((ROOT / "tests" / support).read_text())
    (project / "tests" / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MALLEABLE_TEST_"))}
    for fail, code in (("0", 0), ("1", 1)):
        mark = tmp_path / f"mark-{fail}"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-n", "1"],
            cwd=project, env={**env, "MARK": str(mark), "FAIL": fail}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == code, done.stdout + done.stderr
        assert ("1 failed, 1 passed" if code else "2 passed") in done.stdout, done.stdout
        assert "node down" not in done.stdout + done.stderr and "crashed" not in done.stdout + done.stderr
        assert mark.read_text() == "ran"  # the worker's exit handlers ran before it left
        assert not (tmp_path / f"mark-{fail}-teardown").exists()  # and its heap was not torn down
