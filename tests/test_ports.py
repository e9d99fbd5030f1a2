"""tests/ports.py: a port a test holds for a server it starts later is outside the kernel's
ephemeral range, so no process binding port 0 is handed it meanwhile."""

from __future__ import annotations

import socket

from tests.ports import LOWEST, ephemeral_range, unclaimed_port


def test_the_port_is_free_and_below_the_range_port_0_binds_draw_from():
    low, high = ephemeral_range()
    assert LOWEST < low <= high <= 65535
    drawn = set()
    for _ in range(200):  # what Dask, Prefect and the test processes get when they bind port 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            drawn.add(s.getsockname()[1])
    assert all(low <= p <= high for p in drawn)
    for _ in range(20):
        port = unclaimed_port()
        assert LOWEST <= port < low and port not in drawn
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: the server can take it
