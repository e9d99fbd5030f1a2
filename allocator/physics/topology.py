"""Hosts and allreduce cost: a job inside one host talks over fast local links, across hosts over the network.

A job packed onto as few hosts as possible spans h = ceil(k / gpus_per_host) hosts. Its
allreduce follows the ring model of ``allocator.physics.throughput.t_comm`` with the intra-host
coefficients when h = 1 and the inter-host ones when h > 1 (the slowest link sets a ring's
pace). The two coefficient pairs are fitted separately from measurements tagged with the
hosts they spanned.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from allocator.physics.throughput import fit_allreduce, last_micro_step, t_comm
from allocator.types import AllreduceModel, ClusterSnapshot, ThroughputProfile


def hosts_spanned(gpus: int, gpus_per_host: int | None) -> int:
    """Hosts a job of ``gpus`` ranks spans when packed (1 when the cluster has no host structure)."""
    if gpus_per_host is None or gpus <= 0:
        return 1
    return -(-gpus // gpus_per_host)


def gpus_per_host(snapshot: ClusterSnapshot) -> int | None:
    """The snapshot's host size (its largest node), or None when it carries no nodes."""
    return max(g for _, g in snapshot.nodes) if snapshot.nodes else None


def comm_time(profile: ThroughputProfile, gpus: int | np.ndarray, hosts: int | np.ndarray = 1) -> float | np.ndarray:
    """Allreduce seconds for ``gpus`` ranks spanning ``hosts`` hosts."""
    intra = np.asarray(t_comm(profile.allreduce, profile.num_params, gpus), dtype=float)
    if profile.inter_host is None:
        out = intra
    else:
        inter = np.asarray(t_comm(profile.inter_host, profile.num_params, gpus), dtype=float)
        out = np.where(np.asarray(hosts) > 1, inter, intra)
    return float(out) if out.ndim == 0 else out


def fit_topology(measurements: Sequence[tuple[int, int, int, float]]) -> tuple[AllreduceModel, AllreduceModel]:
    """(intra-host, inter-host) ring fits from (params, gpus, hosts, seconds) measurements.

    Each side is the non-negative least-squares ring fit of its own points; a side without
    points gets the zero model.
    """
    for p, k, h, t in measurements:
        if h < 1 or k < h:
            raise ValueError(f"measurement hosts={h!r}: must be in [1, gpus={k}]")
    intra = fit_allreduce([(p, k, t) for p, k, h, t in measurements if h == 1])
    inter = fit_allreduce([(p, k, t) for p, k, h, t in measurements if h > 1])
    return intra, inter


# γ candidates for ``fit_overlapped_topology``: Pollux bounds its γ to [1, 10] (10 is close to the max).
OVERLAP_GRID = tuple(round(1.0 + 0.05 * i, 2) for i in range(181))


def fit_overlapped_topology(
    measurements: Sequence[tuple[int, int, int, float, float]], overlaps: Sequence[float] = OVERLAP_GRID
) -> tuple[AllreduceModel, AllreduceModel, float]:
    """(intra-host, inter-host, γ) from (params, gpus, hosts, compute seconds, step seconds) measurements.

    A step is (compute^γ + t_comm^γ)^(1/γ) (``allocator.physics.throughput.last_micro_step``), so
    at a given γ each measurement implies an allreduce time (step^γ - compute^γ)^(1/γ) (0 where the
    step is not above compute), to which ``fit_topology`` fits the ring; the γ whose fit predicts
    the steps with the least squared log error wins (ties: the smaller γ, less overlap). Summing
    (γ = 1) charges a job at large per-GPU batches the allreduce it mostly hides, and at small
    ones less than it pays.
    """
    for p, k, h, compute, step in measurements:
        if not (compute > 0 and step > 0 and np.isfinite(compute) and np.isfinite(step)):
            raise ValueError(f"measurement compute={compute!r}, step={step!r}: both must be finite and > 0")
        if h < 1 or k < h:
            raise ValueError(f"measurement hosts={h!r}: must be in [1, gpus={k}]")
    if not overlaps or any(not (g >= 1 and np.isfinite(g)) for g in overlaps):
        raise ValueError(f"overlaps={list(overlaps)!r}: need at least one, each a finite number >= 1")
    params = np.array([m[0] for m in measurements], dtype=float)
    gpus = np.array([m[1] for m in measurements], dtype=float)
    hosts = np.array([m[2] for m in measurements])
    compute = np.array([m[3] for m in measurements], dtype=float)
    step = np.array([m[4] for m in measurements], dtype=float)
    best: tuple[float, float, AllreduceModel, AllreduceModel] | None = None
    for gamma in sorted(float(g) for g in overlaps):
        implied = np.maximum(step**gamma - compute**gamma, 0.0) ** (1.0 / gamma)
        intra = fit_allreduce(list(zip(params[hosts == 1], gpus[hosts == 1], implied[hosts == 1])))
        inter = fit_allreduce(list(zip(params[hosts > 1], gpus[hosts > 1], implied[hosts > 1])))
        comm = np.where(hosts > 1, t_comm(inter, params, gpus), t_comm(intra, params, gpus))  # type: ignore[arg-type]
        error = float(np.sum((np.log(np.asarray(last_micro_step(compute, comm, gamma))) - np.log(step)) ** 2))
        if best is None or error < best[0] - 1e-12 * max(1.0, best[0]):
            best = (error, gamma, intra, inter)
    return best[2], best[3], best[1]  # type: ignore[index]
