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

from allocator.physics.throughput import fit_allreduce, t_comm
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
