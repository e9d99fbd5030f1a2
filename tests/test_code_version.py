"""Issue 35.2 in one process: an entry point's module edited after import is what the next load
runs (also when the edit keeps the size and the second, which a cached .pyc would not notice),
and its code version is the SHA-256 of the file's bytes."""

from __future__ import annotations

import hashlib
import importlib
import sys

from elastic_tasks.code_version import code_version, refresh


def test_refresh_runs_the_file_as_it_is_now_and_the_version_follows_its_bytes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "i35_fresh_mod.py"
    first, second = "VALUE = 'one'\n", "VALUE = 'two'\n"  # same size: mtime+size checks cannot tell
    path.write_text(first)
    try:
        module = refresh(importlib.import_module("i35_fresh_mod"))
        assert module.VALUE == "one"
        assert code_version("i35_fresh_mod:fn") == "sha256:" + hashlib.sha256(first.encode()).hexdigest()
        path.write_text(second)
        importlib.invalidate_caches()
        again = refresh(importlib.import_module("i35_fresh_mod"))
        assert again is module and module.VALUE == "two"
        assert code_version("i35_fresh_mod:fn") == "sha256:" + hashlib.sha256(second.encode()).hexdigest()
        assert refresh(module).VALUE == "two"  # unchanged file: not run again
    finally:
        sys.modules.pop("i35_fresh_mod", None)


def test_no_file_no_version():
    assert code_version("i35_no_such_module_here:fn") is None
    assert refresh(sys) is sys  # a built-in module has no source to refresh from
