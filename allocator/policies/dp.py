"""Seed 000's dynamic program over jobs x GPUs, vectorised with numpy.

P(j, K) = max_{1<=k<=kmax} P(j-1, K-k) + v_j(k), P(0, K) = 0 for all K ("at most K GPUs").
Each job's row is one (K+1) x (kmax+1) numpy operation, so a solve is O(J * K * kmax)
arithmetic in O(J) Python steps.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from allocator.types import InfeasibleError


def solve_dp(values: np.ndarray, capacity: int) -> tuple[np.ndarray, float]:
    """Maximise sum_j values[j, k_j] subject to sum_j k_j <= capacity, every k_j >= 1.

    ``values`` is J x (kmax+1); column 0 and infeasible counts hold -inf. Returns the GPU
    count per job and the optimum. Ties go to the smaller GPU count for the later job,
    deterministically. Raises InfeasibleError if no assignment gives every job a feasible count.
    """
    values = np.asarray(values, dtype=float)
    jobs, width = values.shape
    kmax = width - 1
    if jobs == 0:
        return np.zeros(0, dtype=np.int64), 0.0
    if capacity < jobs:
        raise InfeasibleError(f"{jobs} jobs need at least one GPU each but capacity is {capacity}")
    dtype = np.int16 if kmax < 2**15 else np.int64
    # Work in reversed coordinates: rev[r] = P(capacity - r). Then a sliding window over
    # rev (padded with -inf past the end) gives window[r, k] = P(K - k) for K = capacity - r,
    # with k in increasing order, so argmax picks the smallest k on ties and no array is
    # ever flipped.
    choice = np.zeros((jobs, capacity + 1), dtype=dtype)
    padded = np.full(capacity + 1 + kmax, -np.inf)
    padded[: capacity + 1] = 0.0  # P(0, K) = 0 for every K: "at most K GPUs"
    rows = np.arange(capacity + 1)
    windows = sliding_window_view(padded, kmax + 1)  # a view: sees each in-place update below
    for j in range(jobs):
        cand = windows + values[j]
        arg = np.argmax(cand, axis=1)
        padded[: capacity + 1] = cand[rows, arg]
        choice[j] = arg
    optimum = float(padded[0])
    if not np.isfinite(optimum):
        raise InfeasibleError("no assignment gives every job a feasible GPU count within capacity")
    counts = np.zeros(jobs, dtype=np.int64)
    remaining = capacity
    for j in range(jobs - 1, -1, -1):
        counts[j] = int(choice[j, capacity - remaining])
        remaining -= counts[j]
    return counts, optimum


def solve_dp_python(values: list[list[float]], capacity: int) -> tuple[list[int], float]:
    """The same program as three plain loops (seed 000's Algorithm 1) — the benchmark's reference."""
    jobs = len(values)
    if jobs == 0:
        return [], 0.0
    kmax = len(values[0]) - 1
    neg = float("-inf")
    prev = [0.0] * (capacity + 1)
    choice = [[0] * (capacity + 1) for _ in range(jobs)]
    for j in range(jobs):
        cur = [neg] * (capacity + 1)
        row = values[j]
        for total in range(capacity + 1):
            for k in range(1, min(kmax, total) + 1):
                v = row[k]
                if v == neg:
                    continue
                p = prev[total - k] + v
                if p > cur[total]:
                    cur[total] = p
                    choice[j][total] = k
        prev = cur
    if prev[capacity] == neg:
        raise InfeasibleError("no assignment gives every job a feasible GPU count within capacity")
    counts = [0] * jobs
    remaining = capacity
    for j in range(jobs - 1, -1, -1):
        counts[j] = choice[j][remaining]
        remaining -= counts[j]
    return counts, prev[capacity]
