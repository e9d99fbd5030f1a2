"""Read an HPO job file (YAML or JSON) from disk and validate it into an ``HpoSpec``.

``trial.profile`` may be a path (relative to the file) to a profile JSON; it is read here
and handed to ``allocator.hpo.parse`` by name. Every error is a ValueError naming the file
and the field.
"""

from __future__ import annotations

from pathlib import Path

from allocator.hpo.parse import hpo_spec_from_dict
from allocator.hpo.spec import HpoSpec
from flows.config.jobfile import profile_file
from flows.config.paths import read_data_file


def load_hpo_file(path: str | Path) -> HpoSpec:
    path = Path(path)
    data = read_data_file(path, "hpo file")
    profiles = {}
    trial = data.get("trial") if isinstance(data, dict) else None
    ref = trial.get("profile") if isinstance(trial, dict) else None
    if isinstance(ref, str):
        profiles[ref] = profile_file(path.parent, ref, "trial.profile")
    try:
        return hpo_spec_from_dict(data, profiles)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
