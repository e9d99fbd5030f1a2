"""Paths the user names: read a file (as text, or parsed YAML/JSON), check an output location before any work.

Every failure is one ValueError naming the flag or file and what is wrong with it, raised
before anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml


def read_text_file(path: Path, what: str) -> str:
    """The text of ``path`` (UTF-8); ``what`` names it in errors, e.g. ``jobs file``."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{what} {str(path)!r}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {str(path)!r}: is a directory, not a file") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {str(path)!r}: not UTF-8 text (byte {exc.start}); is it a binary file?") from None
    except OSError as exc:
        raise ValueError(f"{what} {str(path)!r}: cannot read ({exc.strerror})") from None


def read_data_file(path: Path, what: str) -> object:
    """The parsed content of a YAML file (JSON where the name ends in ``.json``)."""
    text = read_text_file(path, what)
    try:
        # YAML is a superset of JSON, but JSON errors read better from the json module.
        # libyaml's loader where built (5-10x faster on a workload's jobs file), the same safe subset.
        return json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{what} {str(path)!r}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({exc})".replace("\n", " ")) from None


def _dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot be (made into) a directory we write into, or None."""
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        return f"{str(existing)!r} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{str(existing)!r} is not writable"
    return None


def check_output_dir(path: Path, flag: str) -> None:
    """``path`` is a directory we could create or write into; nothing is created."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag}={str(path)!r}: is a file, not a directory")
    problem = _dir_problem(path)
    if problem:
        raise ValueError(f"{flag}={str(path)!r}: cannot write there ({problem})")


def check_output_file(path: Path, flag: str) -> None:
    """``path`` is a file we could write (its directory may still have to be made); nothing is created."""
    if path.is_dir():
        raise ValueError(f"{flag}={str(path)!r}: is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag}={str(path)!r}: is not writable")
    problem = _dir_problem(path.parent)
    if problem:
        raise ValueError(f"{flag}={str(path)!r}: cannot write there ({problem})")
