"""Field checks every core type runs at construction, and the batch ceiling they share.

Each raises ``ValueError`` naming the owner, the field and the value, so a message can be
shown to a user as-is.
"""

from __future__ import annotations

import math

# The largest batch (global, or per GPU) accepted: about a million samples, far above any
# published large-batch run. Rate tables hold one candidate per per-GPU batch, so a typo
# such as 1e15 would otherwise make numpy try to allocate petabytes.
MAX_BATCH = 2**20


def require(condition: bool, owner: str, field_name: str, value: object, why: str) -> None:
    if not condition:
        raise ValueError(f"{owner}.{field_name}={value!r}: {why}")


def positive_int(owner: str, name: str, value: object) -> None:
    require(
        isinstance(value, int) and not isinstance(value, bool) and value > 0,
        owner,
        name,
        value,
        "must be a positive integer",
    )


def finite_nonneg(owner: str, name: str, value: object) -> None:
    require(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0,
        owner,
        name,
        value,
        "must be a finite number >= 0",
    )
