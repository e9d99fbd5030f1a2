"""Prefect pull steps for ``prefect.yaml``: what a worker does before it loads a flow.

Prefect substitutes ``{{ $VAR }}`` placeholders in pull steps when ``prefect deploy`` runs, so
``set_working_directory: "{{ $MALLEABLE_HOME }}"`` baked the deploying laptop's path into every
deployment. A step that reads the variable itself is resolved where the flow runs: on the worker.
"""

from __future__ import annotations

import os
from pathlib import Path

# The file every deployment's entry point sits beside; its presence says "this is a checkout".
_MARKER = Path("flows") / "cluster_flow.py"


def malleable_home() -> Path:
    """``$MALLEABLE_HOME`` on this machine, else the directory this package was loaded from."""
    raw = os.environ.get("MALLEABLE_HOME") or str(Path(__file__).resolve().parents[1])
    home = Path(raw).expanduser().resolve()
    if not (home / _MARKER).is_file():
        raise ValueError(
            f"MALLEABLE_HOME={raw!r}: no {_MARKER} there; set MALLEABLE_HOME in the worker's environment "
            "to the malleable checkout (the image's /opt/malleable)"
        )
    return home


def enter_malleable_home() -> dict[str, str]:
    """Change into the malleable checkout on the worker; Prefect runs the flow from there."""
    home = malleable_home()
    os.chdir(home)
    return {"directory": str(home)}
