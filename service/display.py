"""User-provided strings (names, submitters, errors) as an operator's terminal may show them.

A name is whatever a submitter typed: escape sequences would recolour, retitle or rewrite an
operator's terminal, newlines would forge table rows. Shown escaped (``\\x1b``, ``\\n``) and
bounded, so one job cannot flood a table.
"""

from __future__ import annotations

# Names and submitters in a table; an error may say more.
NAME_CHARS = 48
ERROR_CHARS = 200
# What the store keeps (the columns are String(255)).
MAX_NAME_CHARS = 255


def shown(text: str | None, limit: int = NAME_CHARS) -> str:
    """``text`` with every control character escaped, at most ``limit`` characters (… when cut)."""
    if text is None:
        return ""
    safe = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return safe if len(safe) <= limit else safe[: limit - 1] + "…"
