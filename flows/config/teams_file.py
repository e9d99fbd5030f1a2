"""Read a teams file (YAML or JSON) from disk into the ``TeamTable`` the fairness layer takes.

The format is ``allocator.fairness.teams``'; every error is one ValueError naming the file and field.
"""

from __future__ import annotations

from pathlib import Path

from allocator.fairness.teams import TeamTable, teams_from_dict
from flows.config.paths import read_data_file


def load_teams_file(path: str | Path) -> TeamTable:
    path = Path(path)
    return teams_from_dict(read_data_file(path, "teams file"), f"teams file {str(path)!r}")
