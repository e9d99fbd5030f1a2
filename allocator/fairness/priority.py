"""Priority classes: named levels of ``JobSpec.priority`` (an integer; higher goes first).

Inside a team, a higher class is served first and yields last; across teams, GPUs lent from
idle quota go to the highest class asking for them first (``allocator.fairness.shares``). The
names are what people write (a jobs file, ``malleable submit --priority``, a Prefect
deployment's parameters); the spec keeps the number, so a team may also use numbers between
the classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Spaced so that a team can place its own levels between them with plain integers.
PRIORITY_CLASSES: Mapping[str, int] = MappingProxyType({"best-effort": -100, "default": 0, "nightly": 100})


def priority_value(value: object, where: str = "priority") -> int:
    """A class name or an integer -> the spec's integer; ValueError naming ``where`` otherwise."""
    if isinstance(value, str):
        key = value.strip().lower().replace("_", "-")
        if key in PRIORITY_CLASSES:
            return PRIORITY_CLASSES[key]
        raise ValueError(f"{where}={value!r}: unknown priority class (known: {', '.join(PRIORITY_CLASSES)}, or an integer)")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{where}={value!r}: must be a priority class ({', '.join(PRIORITY_CLASSES)}) or an integer")


def priority_name(value: int) -> str:
    """The class a priority is, else the number itself (for tables and reports)."""
    for name, level in PRIORITY_CLASSES.items():
        if level == value:
            return name
    return str(value)
