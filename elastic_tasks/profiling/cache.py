"""Profiles on disk, keyed by model, hardware and the settings that shaped the figures.

A profile measured on one machine says nothing about another, and a ladder of batch sizes
is part of what was measured, so the key is (workload name, hardware fingerprint, settings
digest). The directory is injected; writes are atomic (temp file + rename) so a reader never
sees half a file and two profilers racing on one key just overwrite each other.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from allocator.profiles.io import profile_from_dict, profile_to_dict
from allocator.types import ThroughputProfile

_FORMAT = 1


@dataclass(frozen=True, slots=True)
class ProfileKey:
    workload: str
    hardware: str
    settings: str  # a canonical description of what was measured (ladder, cap, allreduce setup)

    def digest(self) -> str:
        text = json.dumps([_FORMAT, self.workload, self.hardware, self.settings])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def filename(self) -> str:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.workload)[:64] or "profile"
        return f"{safe}-{self.digest()}.json"


class ProfileCache:
    """A directory of ``<workload>-<digest>.json`` files holding ``{"key": ..., "profile": ...}``."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    def path(self, key: ProfileKey) -> Path:
        return self.directory / key.filename()

    def get(self, key: ProfileKey) -> ThroughputProfile | None:
        """The cached profile, or None if absent; a corrupt or mismatched file counts as absent."""
        path = self.path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("key") != _key_dict(key):
            return None
        try:
            return profile_from_dict(data.get("profile"), str(path))
        except ValueError:
            return None

    def put(self, key: ProfileKey, profile: ThroughputProfile) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        payload = json.dumps({"key": _key_dict(key), "profile": profile_to_dict(profile)}, indent=2)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(payload)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def _key_dict(key: ProfileKey) -> dict[str, object]:
    return {"format": _FORMAT, "workload": key.workload, "hardware": key.hardware, "settings": key.settings}
