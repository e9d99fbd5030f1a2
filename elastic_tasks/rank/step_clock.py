"""How long a rank's local work took (straggler detection's throughput), without a host sync.

On the CPU, wall time is the work's time. On a GPU, the host only launches kernels, so the
wall time between two host points measures launches, not the GPU's work; CUDA events
recorded on the stream measure the work itself, and reading them once they have completed
costs no synchronisation. ``LocalClock`` records a pair of events per step and reports the
newest pair that has completed (usually the previous step's): a straggler shows in its
throughput a step late, which the detector's EWMA does not notice.
"""

from __future__ import annotations

import time

import torch


class LocalClock:
    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._t0 = 0.0
        self._pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._last = 0.0

    def start(self) -> None:
        if self._cuda:
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
            self._pairs.append((begin, torch.cuda.Event(enable_timing=True)))
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._cuda:
            self._pairs[-1][1].record()
        else:
            self._last = time.perf_counter() - self._t0

    def seconds(self) -> float:
        """The newest completed measurement in seconds (0.0 before any has completed)."""
        while self._pairs and self._pairs[0][1].query():
            begin, end = self._pairs.pop(0)
            self._last = begin.elapsed_time(end) / 1000.0
        del self._pairs[:-4]  # never hold more than a few steps' events
        return self._last
