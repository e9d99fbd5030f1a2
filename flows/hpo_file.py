"""Read an HPO job file (YAML or JSON) from disk and validate it into an ``HpoSpec``.

``trial.profile`` may be a path (relative to the file) to a profile JSON; it is read here
and handed to ``allocator.hpo.parse`` by name. Every error is a ValueError naming the file
and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from allocator.hpo.parse import hpo_spec_from_dict
from allocator.hpo.spec import HpoSpec
from allocator.profile_io import profile_from_dict
from flows.paths import read_text_file


def load_hpo_file(path: str | Path) -> HpoSpec:
    path = Path(path)
    text = read_text_file(path, "hpo file")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"hpo file {str(path)!r}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({exc})".replace("\n", " ")) from None
    profiles = {}
    trial = data.get("trial") if isinstance(data, dict) else None
    ref = trial.get("profile") if isinstance(trial, dict) else None
    if isinstance(ref, str):
        target = (path.parent / ref).resolve()
        if not target.exists():
            raise ValueError(f"trial.profile={ref!r}: no such profile file ({target})")
        try:
            profiles[ref] = profile_from_dict(json.loads(read_text_file(target, f"trial.profile={ref!r}: profile file")), "trial.profile")
        except json.JSONDecodeError as exc:
            raise ValueError(f"trial.profile={ref!r}: {target} is not valid JSON ({exc})") from None
    try:
        return hpo_spec_from_dict(data, profiles)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
