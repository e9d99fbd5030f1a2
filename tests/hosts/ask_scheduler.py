"""Ask a Dask scheduler from inside a host namespace what each worker runs (the test process
cannot reach the namespaces' subnet).

``python -m tests.hosts.ask_scheduler SCHEDULER`` prints one JSON object: each worker's address
to the keys of the tasks it is processing now.
"""

from __future__ import annotations

import json
import sys

from distributed import Client


def main(scheduler: str) -> None:
    with Client(scheduler, timeout=30) as client:
        processing = client.processing()
    print(json.dumps({worker: [str(k) for k in keys] for worker, keys in processing.items()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
