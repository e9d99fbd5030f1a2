"""What happens to a job that does not fit now: one enum, importing nothing of the allocator.

A leaf of its own (``allocator.protocols`` names it too) so that the settings, which every
command reads, take the word without loading the allocator's types.
"""

from __future__ import annotations

from enum import Enum


class OverflowMode(str, Enum):
    """What happens to a job that does not fit now."""

    DROP = "drop"
    QUEUE = "queue"
