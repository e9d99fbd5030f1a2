"""docs/porting.md's recipe loads from its own directory and passes the one-step pre-flight check."""

import sys
from pathlib import Path

from elastic_tasks.preflight import check_recipe
from elastic_tasks.recipe import load_entry_point

PORTING = Path(__file__).resolve().parents[1] / "examples" / "porting"


def test_ported_recipe_loads_from_its_directory_and_checks(monkeypatch):
    monkeypatch.chdir(PORTING)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(PORTING))])
    for name in ("recipe", "plain_loop"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    recipe = load_entry_point("recipe:recipe")
    assert recipe.precision == "bf16" and recipe.clip_grad_norm == 1.0 and recipe.loader.num_workers == 2
    check_recipe(recipe)
    # The schedule is a factor by samples seen: full LR at the start, zero at the end.
    assert recipe.lr_schedule(0) == 1.0 and abs(recipe.lr_schedule(200 * 64)) < 1e-12
