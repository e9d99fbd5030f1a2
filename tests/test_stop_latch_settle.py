"""A SIGTERM that lands after ``malleable serve`` stopped cleanly must not turn exit 0 into 143.

Python's finalisation puts back the default action for every signal with a Python handler, so a
process manager's late second SIGTERM killed a cleanly stopped service (CI saw rc -15 after
"stopped"). A real process is flooded with SIGTERMs from a child shell all through its exit."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import subprocess, sys, time
from flows.commands.shared import stop_latch
latch = stop_latch.armed()
if sys.argv[1] == "settle":
    latch.settle()
# SIGTERM every millisecond until this process is gone (bounded: at most ~5 s).
subprocess.Popen(["sh", "-c", "i=0; while [ $i -lt 5000 ] && kill -TERM $PPID 2>/dev/null; do i=$((i+1)); sleep 0.001; done"])
time.sleep(0.3)  # signals arrive while the work ends, then all through the interpreter's exit
"""


def _exit_code(mode: str) -> int:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], timeout=60).returncode


def test_a_settled_latch_exits_zero_under_a_flood_of_sigterms():
    assert _exit_code("settle") == 0


def test_without_settling_the_flood_kills_the_exit():
    # The control: the same flood kills a process whose latch was not settled (the bug).
    assert _exit_code("keep") == -15
