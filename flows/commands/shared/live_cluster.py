"""What the running service's cluster holds now, asked of its scheduler (for `jobs --usage` and
`submit`'s check that a job could ever be placed)."""

from __future__ import annotations

import time


def live_gpus(store) -> tuple[int | None, str]:
    """The GPU workers of the cluster the service holding the store's lease drives (None: none reachable)."""
    from service.store.lease import Lease

    info = Lease(store).info()
    if info.holder is None or info.expires_at <= time.time() or not info.cluster_address:
        return None, ""
    from distributed import Client

    from elastic_tasks.cluster import gpu_workers

    try:
        with Client(info.cluster_address, timeout=3, set_as_default=False) as client:
            return len(gpu_workers(client)), "the running service's workers"
    except (OSError, TimeoutError):
        return None, ""
