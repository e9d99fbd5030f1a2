"""Shared fixtures: a session-scoped Prefect test harness (a temporary API and database).

Tests that run flows request ``prefect_harness``; it costs ~10 s once per session, so it is
only started when some selected test asks for it.
"""

from __future__ import annotations

import os
import tempfile

import pytest

# Before prefect is imported anywhere in the session.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
# Persisted task results (the profile cache among them) would otherwise outlive the session in
# ~/.prefect/storage, and a later session would read a cache hit where a test expects a miss.
os.environ["PREFECT_LOCAL_STORAGE_PATH"] = tempfile.mkdtemp(prefix="malleable-test-prefect-storage-")


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
