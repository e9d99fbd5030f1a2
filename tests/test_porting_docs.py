"""Every code block of docs/porting.md runs, in order, in examples/porting/ (a doc test).

``python`` blocks are executed in one namespace, as a reader would paste them; ``pycon`` blocks
are doctests in that namespace (their expected output, tracebacks included, must match). A
block after ``<!-- doctest: slow -->`` trains on real Dask workers and runs as a slow test.
"""

import doctest
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PORTING = ROOT / "examples" / "porting"
DOC = ROOT / "docs" / "porting.md"
BLOCK = re.compile(r"(<!-- doctest: slow -->\n)?```(python|pycon)\n(.*?)```", re.S)


def _blocks(slow: bool) -> list[tuple[str, str]]:
    return [(kind, code) for marker, kind, code in BLOCK.findall(DOC.read_text()) if bool(marker) == slow]


def _run(blocks: list[tuple[str, str]]) -> dict:
    namespace: dict = {"__name__": "porting_doc"}
    for i, (kind, code) in enumerate(blocks):
        if kind == "python":
            exec(compile(code, f"{DOC}:block{i}", "exec"), namespace)  # noqa: S102 - the doc's own snippets
            continue
        test = doctest.DocTestParser().get_doctest(code, namespace, f"porting.md block {i}", str(DOC), 0)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test, clear_globs=False)
        assert runner.tries > 0 and runner.failures == 0, f"doctest block {i} of {DOC.name} failed (see the output above)"
    return namespace


@pytest.fixture
def porting_dir(monkeypatch):
    monkeypatch.chdir(PORTING)
    monkeypatch.syspath_prepend(str(PORTING))  # spawned Dask workers inherit it
    for name in ("recipe", "plain_loop"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return PORTING


def test_every_snippet_of_the_porting_guide_runs_in_order(porting_dir):
    blocks = _blocks(slow=False)
    assert sum(kind == "pycon" for kind, _ in blocks) == 2 and len(blocks) >= 7
    namespace = _run(blocks)
    assert namespace["recipe"]().name == "rows"


def test_the_guides_recipe_is_the_file_in_examples():
    shown = next(code for kind, code in _blocks(slow=False) if "def recipe():" in code)
    assert shown.strip() in (PORTING / "recipe.py").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_guides_history_snippet_trains_a_job(porting_dir):
    (block,) = _blocks(slow=True)
    namespace = _run([block])
    assert len(namespace["result"].history) == 12
