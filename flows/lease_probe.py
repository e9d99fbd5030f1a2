"""A container probe for ``malleable serve`` (deploy/k8s/service.yaml): exit 0 while a service on
this host holds the job store's lease and keeps renewing it, else 1 with one line saying why.

The service renews its lease every few seconds from its own thread; a service that hangs or
lost its store stops renewing, and the probe then restarts the pod (the next service resumes
the jobs from their checkpoints)."""

from __future__ import annotations

import socket
import sys
import time


def main() -> int:
    from flows.config.settings import SettingsError, load_settings
    from service.store.lease import Lease
    from service.store import JobStore, StoreError

    try:
        store = JobStore(load_settings().resolved_job_store, create=False)
    except (SettingsError, StoreError) as exc:
        print(f"probe: {exc}")
        return 1
    try:
        info = Lease(store).info()
    finally:
        store.close()
    if info.holder is None or info.host != socket.gethostname():
        print(f"probe: the job store's lease is held by {info.host or 'nobody'}, not {socket.gethostname()}")
        return 1
    if info.expires_at <= time.time():
        print(f"probe: the lease expired {time.time() - info.expires_at:.0f} s ago (the service stopped renewing it)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
