"""One Prefect API for a whole test session, however many test processes run it.

Each pytest-xdist worker used to start Prefect's test harness (a server subprocess) for itself:
four servers, each ~8 CPU-s to start and ~1 CPU-s a minute idle for the rest of the session
(sampled from /proc over a suite run: 92 CPU-s for the four). The first process that needs the
API starts this module as a process of its own, which starts Prefect's server (the harness's
``SubprocessASGIServer``: the same ephemeral server, on a copy of the migrated database), writes
its URL to a file beside the session's temporary folders, and stops the server once the session's
pytest process has gone, however it ended (polled every second). The others read the file.

``python -m tests.shared_prefect_api OWNER_PID HOME URL_FILE``
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
from filelock import FileLock

from tests.prefect_homes import seed_home

DATABASE = "prefect-test.db"
START_TIMEOUT_S = 150.0


def session_api_url(root: Path, owner_pid: int, template: Path) -> str:
    """The session's API URL, starting its server from ``template`` if no process has yet. ``root``
    is the folder every test process of the session shares; the server outlives none of them."""
    url_file, log = root / "prefect-api.url", root / "prefect-api.log"
    with FileLock(str(root / "prefect-api.lock")):
        if not url_file.is_file():
            home = seed_home(root / "prefect-api-home", template, DATABASE)
            with log.open("w") as out:
                launcher = subprocess.Popen(
                    [sys.executable, "-m", __name__, str(owner_pid), str(home), str(url_file)],
                    cwd=Path(__file__).resolve().parents[1], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            deadline = time.monotonic() + START_TIMEOUT_S
            while not url_file.is_file():
                if launcher.poll() is not None or time.monotonic() > deadline:
                    launcher.kill()
                    raise RuntimeError(f"the session's Prefect API did not start; its log ({log}):\n{log.read_text()[-4000:]}")
                time.sleep(0.2)
    return url_file.read_text()


def _serve(owner_pid: int, home: Path, url_file: Path) -> None:
    os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{home / DATABASE}"
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    import httpx
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    try:
        try:
            server.start(timeout=120)
        except httpx.TransportError:  # a connection reset while it started (seen on CI, load ~5): once more
            server.stop()
            server = SubprocessASGIServer()
            server.start(timeout=120)
        partial = url_file.with_suffix(".partial")
        partial.write_text(server.api_url)
        os.replace(partial, url_file)
        while psutil.pid_exists(owner_pid):
            time.sleep(1.0)
    finally:
        server.stop()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
