"""Which device a rank uses, which backend its process groups speak, where rendezvous binds.

* One GPU per rank: each GPU worker is started seeing its own device first
  (``CUDA_VISIBLE_DEVICES`` rotated per worker, as dask-cuda does), so the rank's device is
  ``cuda:0`` of its own view, and the rank calls ``torch.cuda.set_device`` on it.
* nccl carries CUDA tensors only; the per-step agreement and Adam's ``step`` are CPU
  tensors, so an nccl job's process group is ``cpu:gloo,cuda:nccl``: each collective goes
  over the backend of its tensors' device.
* Multi-node: gloo and nccl choose a network interface themselves unless told
  (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``); a rank host name that resolves to a
  loopback address in a cluster of several hosts makes peers connect to themselves.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that use it (all of them run in rank processes): the
# service and the cluster start-up import this module only for names and host checks, and a
# `malleable serve` that imported torch for them took seconds longer to start (issue 28, recovery).

MIXED_BACKEND = "cpu:gloo,cuda:nccl"
# The Dask worker resource one GPU is: a rank asks for one, so it lands on a worker of its own.
GPU_RESOURCE = "GPU"


def default_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def process_group_backend(backend: str) -> str:
    """The backend string for ``init_process_group``: nccl jobs get a gloo side for CPU tensors."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}: expected 'gloo' or 'nccl'")
    return MIXED_BACKEND if backend == "nccl" else "gloo"


def rank_device(backend: str) -> torch.device:
    """The rank's device; on nccl the first GPU this worker sees, made current for the process."""
    import torch

    if backend != "nccl":
        return torch.device("cpu")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    return device


def cuda_worker_env(visible: Sequence[str], n_workers: int | None = None) -> list[dict[str, str]]:
    """Each GPU worker's environment: worker i sees device ``visible[i]`` first (dask-cuda's rotation).

    The other devices stay visible after it (peer-to-peer copies still work) but the rank
    only ever uses its own, ``cuda:0`` of its view.
    """
    devices = [str(d).strip() for d in visible]
    if not devices or any(not d for d in devices):
        raise ValueError(f"CUDA_VISIBLE_DEVICES={','.join(visible)!r}: expected a comma-separated list of devices")
    n = len(devices) if n_workers is None else n_workers
    if not (isinstance(n, int) and 1 <= n <= len(devices)):
        raise ValueError(f"n_workers={n!r}: must be between 1 and the {len(devices)} visible GPU(s)")
    return [{"CUDA_VISIBLE_DEVICES": ",".join(devices[i:] + devices[:i])} for i in range(n)]


def socket_env(gloo_ifname: str | None, nccl_ifname: str | None) -> dict[str, str]:
    """Environment for worker processes: the interface gloo and nccl bind and connect on."""
    env: dict[str, str] = {}
    if gloo_ifname:
        env["GLOO_SOCKET_IFNAME"] = gloo_ifname
    if nccl_ifname:
        env["NCCL_SOCKET_IFNAME"] = nccl_ifname
    return env


def _resolve(host: str) -> list[str]:
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None)})
    except OSError:
        return []


def loopback_warning(hosts: Iterable[str], resolve: Callable[[str], list[str]] = _resolve) -> str | None:
    """A warning when several hosts take part and one of them resolves to a loopback address.

    A rank on that host would publish an address its peers on other machines cannot reach
    (typically ``/etc/hosts`` maps the machine's own name to 127.0.1.1).
    """
    distinct = sorted(set(hosts))
    if len(distinct) < 2:
        return None
    bad: Mapping[str, list[str]] = {h: a for h in distinct if (a := resolve(h)) and any(ipaddress.ip_address(x.split("%")[0]).is_loopback for x in a)}
    if not bad:
        return None
    named = ", ".join(f"{h} -> {', '.join(a)}" for h, a in bad.items())
    return (
        f"rendezvous hosts {', '.join(distinct)}: {named} resolves to loopback, so ranks on other hosts cannot reach it; "
        "start workers with a routable --host/--listen-address or fix the name's DNS/hosts entry"
    )


def interface_of(address: str, interfaces: Mapping[str, Iterable[str]] | None = None) -> str | None:
    """The network interface holding ``address`` (an IP), or None; ``interfaces``: name -> addresses (default: this host's).

    On a host with several interfaces gloo otherwise binds where the host name resolves,
    which inside a container or network namespace is often an address that host does not
    have, and then loopback: peers on other hosts can never connect.
    """
    if interfaces is None:
        import psutil  # distributed's own dependency

        interfaces = {name: [a.address for a in addrs] for name, addrs in psutil.net_if_addrs().items()}
    want = address.strip("[]").split("%")[0]
    for name, addrs in sorted(interfaces.items()):
        if any(a.split("%")[0] == want for a in addrs):
            return name
    return None


def own_socket_env(address: str, environ: Mapping[str, str], interfaces: Mapping[str, Iterable[str]] | None = None) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` to add for a rank whose worker listens on ``address``.

    Only the variables the user has not set, and nothing for a loopback address (a single
    host) or one no interface holds (a name, NAT): the user's setting always wins.
    """
    host = address.strip("[]").split("%")[0]
    try:
        if ipaddress.ip_address(host).is_loopback:
            return {}
    except ValueError:
        return {}
    name = interface_of(host, interfaces)
    if name is None:
        return {}
    return {var: name for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if not environ.get(var)}
