"""Shared fixtures: the session's one Prefect API (a temporary server and database).

Tests that run flows request ``prefect_harness``; its server costs ~10 s once per session (one
for all test processes: tests/shared_prefect_api.py), so it is only started when some selected
test asks for it. Its database, and those of tests that start a
Prefect API of their own, are copies of one migrated database (``prefect_db_template``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

# Before prefect is imported anywhere in the session.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
# Persisted task results (the profile cache among them) would otherwise outlive the session in
# ~/.prefect/storage, and a later session would read a cache hit where a test expects a miss.
os.environ["PREFECT_LOCAL_STORAGE_PATH"] = tempfile.mkdtemp(prefix="malleable-test-prefect-storage-")


@pytest.fixture(scope="session")
def prefect_db_template(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Prefect database migrated to this Prefect's head (tests/prefect_homes.py), made once per
    Prefect release and kept in pytest's cache: later sessions and parallel workers copy it."""
    from tests.prefect_homes import migrated_template

    # `-p no:cacheprovider` leaves the config without a cache attribute at all (not None).
    cache = getattr(request.config, "cache", None)
    return migrated_template(cache.mkdir("prefect-db") if cache is not None else tmp_path_factory.mktemp("prefect-db"))


@pytest.fixture
def migrated_prefect_home(prefect_db_template: Path) -> Callable[[Path], Path]:
    """Makes a PREFECT_HOME whose database is a copy of the migrated one: for a test whose Prefect API
    must be its own (a `prefect server start`, a CLI's ephemeral API) but need not migrate a fresh one."""
    from tests.prefect_homes import seed_home

    return functools.partial(seed_home, template=prefect_db_template)


@pytest.fixture(scope="session")
def prefect_harness(prefect_db_template: Path, tmp_path_factory: pytest.TempPathFactory):
    """The session's one Prefect API (tests/shared_prefect_api.py), this process's flows pointed at it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.shared_prefect_api import session_api_url

    worker = "PYTEST_XDIST_WORKER" in os.environ
    # xdist's workers share the parent of their temporary folders, and their parent is the session's pytest.
    root = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    url = session_api_url(root, os.getppid() if worker else os.getpid(), prefect_db_template)
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


@pytest.fixture(scope="session")
def prefect_api_url(prefect_harness) -> str:
    """The session's Prefect API, for CLI subprocesses (as their PREFECT_API_URL): a command whose
    flow would otherwise start an ephemeral API of its own (~10 s of CPU each, more with a fresh
    database's migrations) connects to this one. Tests of the ephemeral API itself do not use it."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


# -- the README's one command runs the suite in parallel --------------------------------------
# Most of the suite waits (on subprocesses, Dask clusters, servers, sockets) rather than computes,
# so a few test processes finish it in well under the serial time even on 2 cores.
# `pytest` with no paths (the README's command, CI's) runs WORKERS processes, whole files each
# (a file's tests share module fixtures and sometimes order); naming paths runs serially (quick to
# start for one file); `-n N` or MALLEABLE_TEST_WORKERS=N (0: serial) choose. Four: with training
# workers forked (deploy/forkserver.py, deploy/nanny_group.py) the suite spends ~820-1,160 CPU-s
# (the box's speed moves), and a clean clone ran in 11 min 22 s with 4 against 13 min 51 s with 3
# and 11 min 44 s with 5 (stop 46, one hour); the files' waits overlap the rest.
DEFAULT_WORKERS = 4


def _is_xdist_worker(config: pytest.Config) -> bool:
    # A worker re-runs this hook with the controller's options: adding workers there would spawn
    # workers recursively (seen once: hundreds of processes).
    return hasattr(config, "workerinput") or "PYTEST_XDIST_WORKER" in os.environ


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("xdist") or _is_xdist_worker(config):
        return
    if config.option.numprocesses is not None or config.getoption("usepdb", False):
        return  # the user chose
    chosen = os.environ.get("MALLEABLE_TEST_WORKERS")
    if chosen is None and config.args_source is not pytest.Config.ArgsSource.TESTPATHS:
        return  # paths named: serial
    try:
        workers = DEFAULT_WORKERS if chosen is None else int(chosen)
    except ValueError:
        raise pytest.UsageError(f"MALLEABLE_TEST_WORKERS={chosen!r}: expected a whole number of test processes (0: serial)") from None
    if workers > 0:
        config.option.numprocesses = workers
        if config.option.dist == "no":
            config.option.dist = "loadfile"
            # xdist's default queues files by their number of tests, most first: a one-test system
            # file of minutes then starts last and runs alone at the end. Ours: see below.
            config.option.loadscopereorder = False


# Seconds each file took, from the last run that ran it (pytest's cache, .pytest_cache/).
FILE_SECONDS = "malleable/file_seconds"
# ... and where no run left a cache (a fresh clone: CI), a committed measurement of each file
# (`python -m tests.timing TIMES --baseline tests/file_seconds.json` writes it from a timed run).
BASELINE_SECONDS = Path(__file__).with_name("file_seconds.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In parallel, the longest files go first (longest-processing-time order): the run's tail is
    then short files filling in beside the last long one, not one long file started last. A file's
    length is what it took last time (else what the committed baseline says); a file never timed
    counts as long if it holds slow tests."""
    if not _is_xdist_worker(config):  # workers collect (and order) what the controller hands out
        return
    cache = getattr(config, "cache", None)
    baseline: dict[str, float] = json.loads(BASELINE_SECONDS.read_text()) if BASELINE_SECONDS.is_file() else {}
    seconds: dict[str, float] = {**baseline, **(cache.get(FILE_SECONDS, {}) if cache is not None else {})}
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def length(item: pytest.Item) -> float:
        known = seconds.get(item.nodeid.split("::")[0])
        return known if known is not None else (math.inf if item.path in slow_files else 0.0)

    items.sort(key=lambda item: -length(item))  # stable: each file's order kept


class _FileSeconds:
    """Adds up each file's setup, call and teardown seconds as reports arrive (in the controller of a
    parallel run: every worker's), and keeps them in the cache for the next run's order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::")[0]
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(session.config, "cache", None)
        if cache is not None and self.seconds:
            cache.set(FILE_SECONDS, {**cache.get(FILE_SECONDS, {}), **{k: round(v, 1) for k, v in self.seconds.items()}})


def pytest_configure(config: pytest.Config) -> None:
    from tests.process_costs import register as spare_process_costs

    spare_process_costs(config, controller=not _is_xdist_worker(config))
    if not _is_xdist_worker(config):
        config.pluginmanager.register(_FileSeconds(), "malleable-file-seconds")
    if os.environ.get("MALLEABLE_TEST_TIMES"):  # each test's wall and CPU seconds (tests/timing.py)
        from tests.timing import register

        register(config)
