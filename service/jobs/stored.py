"""The store's record of a job: written from a ``JobSpec`` as ``allocator.specs.spec_to_dict`` writes
it, and read back in any format it was written in.

Rows written before (the format of a jobs-file entry: ``samples``, ``gpus``, ``deadline_s``, …)
are upgraded when read, so a store never needs rewriting. The allocator's parsers are imported
only to write a record or upgrade an old one: reading a current row (each refresh of
`malleable jobs`) needs none of them, and the CLI's start-up does not pay for them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from allocator.types import JobSpec


def stored_record(data: object, job_id: str) -> object:
    """A row's stored job as ``spec_to_dict`` data under the row's id: a row written in the earlier
    jobs-file-entry format (it says ``samples``, not ``total_samples``) is upgraded here. What
    cannot be read is returned as it is: the feed fails that job, naming the field."""
    if not isinstance(data, dict):
        return data
    if "total_samples" not in data:
        from allocator.specs import job_from_dict, spec_to_dict

        try:
            data = spec_to_dict(job_from_dict(data, 0, {}))
        except ValueError:
            return data
    return {**data, "id": job_id}


def record_for_store(spec: JobSpec, job_id: str) -> dict:
    """What the store writes for ``spec`` submitted as ``job_id``: its serialisation under the
    store's id, arriving when the service sees it (its arrival on the loop's clock is set then)."""
    from allocator.specs import spec_to_dict

    return spec_to_dict(dataclasses.replace(spec, id=job_id, arrival_time=0.0))
