"""Paths the user names: read a file (as text, or parsed YAML/JSON), check an output location before any work.

Every failure is one ValueError naming the flag or file and what is wrong with it, raised
before anything is written.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import yaml


# What a file the user names may hold: a jobs file of 100,000 jobs is ~20 MB. Checked before
# anything is read, so /dev/zero or a 10 GB file is one line, not a MemoryError.
MAX_INPUT_BYTES = 64 * 2**20
# How deeply a YAML/JSON input may nest (a jobs file needs ~5 levels): deeper is refused as one
# line rather than a RecursionError from the parser.
MAX_INPUT_DEPTH = 64


def regular_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a regular file we may read whole (a FIFO would block, a device never
    ends, a directory is not a file), or None. ``stat`` never blocks, unlike ``open`` on a FIFO."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot read ({exc.strerror})"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file"
        return f"is {kind}, not a regular file"
    if st.st_size > MAX_INPUT_BYTES:
        return f"is {st.st_size:,} bytes, more than the {MAX_INPUT_BYTES:,} an input file may hold"
    return None


def read_text_file(path: Path, what: str) -> str:
    """The text of ``path`` (UTF-8, a regular file within ``MAX_INPUT_BYTES``); ``what`` names it in errors, e.g. ``jobs file``."""
    problem = regular_file_problem(path)
    if problem is not None:
        raise ValueError(f"{what} {str(path)!r}: {problem}")
    try:
        with open(path, "rb") as f:  # bounded: a file that grew since stat is still cut at the cap
            data = f.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise ValueError(f"{what} {str(path)!r}: more than the {MAX_INPUT_BYTES:,} bytes an input file may hold")
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {str(path)!r}: not UTF-8 text (byte {exc.start}); is it a binary file?") from None
    except OSError as exc:
        raise ValueError(f"{what} {str(path)!r}: cannot read ({exc.strerror})") from None


def read_json_file(path: Path, what: str) -> object:
    """The parsed JSON of ``path``, with ``read_data_file``'s limits, whatever its suffix."""
    text = read_text_file(path, what)
    try:
        data = json.loads(text)
        too_deep = _depth(data, MAX_INPUT_DEPTH) > MAX_INPUT_DEPTH
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {str(path)!r}: not valid JSON ({exc})") from None
    except RecursionError:
        too_deep = True
    if too_deep:
        raise ValueError(f"{what} {str(path)!r}: JSON nested more than {MAX_INPUT_DEPTH} levels deep")
    return data


def _depth(value: object, limit: int) -> int:
    """How deeply ``value`` nests, counted no further than ``limit`` + 1 (iteratively: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def read_data_file(path: Path, what: str) -> object:
    """The parsed content of a YAML file (JSON where the name ends in ``.json``), nested at most ``MAX_INPUT_DEPTH`` deep."""
    text = read_text_file(path, what)
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        # YAML is a superset of JSON, but JSON errors read better from the json module.
        # libyaml's loader where built (5-10x faster on a workload's jobs file), the same safe subset.
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{what} {str(path)!r}: not valid {kind} ({exc})".replace("\n", " ")) from None
    except RecursionError:
        raise ValueError(f"{what} {str(path)!r}: {kind} nested more than {MAX_INPUT_DEPTH} levels deep") from None
    if _depth(data, MAX_INPUT_DEPTH) > MAX_INPUT_DEPTH:
        raise ValueError(f"{what} {str(path)!r}: {kind} nested more than {MAX_INPUT_DEPTH} levels deep")
    return data


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
