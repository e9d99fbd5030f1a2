"""Strict reading of parsed YAML/JSON: a mapping where one is expected, no unknown keys.

Jobs files, HPO files and profiles share these checks so a typo (``max_bacth``) is refused
with the same one-line message everywhere: where it is, which field, and what is known.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def mapping(value: object, where: str) -> Mapping[str, object]:
    """``value`` if it is a mapping; else ``ValueError`` naming ``where`` and what was found."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def check_fields(data: Mapping[str, object], known: Collection[str], where: str, required: Sequence[str] = (), *, kind: str = "field") -> None:
    """Refuse the first unknown key (listing the known ones), then the first missing required one."""
    unknown = sorted(str(k) for k in set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown {kind} (known: {', '.join(sorted(known))})")
    for key in required:
        if key not in data:
            raise ValueError(f"{where}.{key}: missing required field")
