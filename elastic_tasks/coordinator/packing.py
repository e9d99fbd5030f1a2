"""Which free GPU workers a job takes: as few hosts as possible (a pure choice, tested by enumeration).

Ranks on one host talk over shared memory or NVLink; across hosts, over the network, whose
allreduce is slower (``allocator.physics.topology``: the goodput model charges a job by the hosts it
spans, counting it packed onto as few as possible — the executor must do what the model
assumes). A worker's host is the host part of its address.

The rule, for n workers of which the job may already hold some (a grow):
1. free workers on hosts the job already spans first (they add no host), most free first;
2. then new hosts, the host with the most free workers first, except that the last host
   needed is the one with the fewest free workers that still covers what is left (best fit:
   a job that fits on one host leaves the larger hosts whole for the next big job).
Taking the largest hosts first needs the fewest hosts (the k largest hold more than any other
k), and the best fit for the last one keeps that count. Ties go by host name, then address;
the chosen workers come grouped by host, so neighbouring ranks share a host.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from distributed.comm import get_address_host


def host_of(address: str) -> str:
    return get_address_host(address)


def choose_workers(free: Sequence[str], n: int, held: Iterable[str] = ()) -> list[str]:
    """``n`` of the ``free`` worker addresses, spanning (with ``held``, the job's own) the fewest hosts."""
    if not (isinstance(n, int) and 0 <= n <= len(set(free))):
        raise ValueError(f"n={n!r}: must be an integer in [0, {len(set(free))}] (the free workers)")
    by_host: dict[str, list[str]] = {}
    for addr in sorted(set(free)):
        by_host.setdefault(host_of(addr), []).append(addr)
    spanned = {host_of(a) for a in held}
    most_first = sorted(by_host, key=lambda h: (-len(by_host[h]), h))
    order = [h for h in most_first if h in spanned]
    fresh = [h for h in most_first if h not in spanned]
    left = n - sum(len(by_host[h]) for h in order)
    while left > 0:
        fits = [h for h in fresh if len(by_host[h]) >= left]
        host = min(fits, key=lambda h: (len(by_host[h]), h)) if fits else fresh[0]
        fresh.remove(host)
        order.append(host)
        left -= len(by_host[host])
    chosen: list[str] = []
    for host in order:
        chosen += by_host[host][: n - len(chosen)]
    return chosen
