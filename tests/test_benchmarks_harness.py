"""The benchmark runner, compare and the docs-history parser (issue 39.3), on fake benchmarks.

No real benchmark runs here: the runner is pointed at scripts written into a temporary
directory, whose figures the test knows because it chose them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import main
from benchmarks.harness import history, results, runner, table
from benchmarks.harness.registry import BENCHMARKS, EXCLUDED, Benchmark, Figure, Registry

REPO = Path(__file__).resolve().parents[1]

FAKE = """
import json, sys
n = int(sys.argv[sys.argv.index("--n") + 1])
print("some progress text")
print(json.dumps({"total": sum(range(n)), "n": n, "nested": {"mean": sum(range(n)) / n}, "series": list(range(n))}))
"""

COUNTER = """
import json, pathlib
p = pathlib.Path("count.txt")
k = int(p.read_text()) + 1 if p.exists() else 1
p.write_text(str(k))
print(json.dumps({"value": k * k}))
"""


def _registry(root: Path, *benches: Benchmark) -> Registry:
    return Registry(benchmarks=benches, root=str(root))


def test_run_writes_one_results_file_with_what_each_script_printed(tmp_path: Path) -> None:
    (tmp_path / "fake_bench.py").write_text(FAKE)
    (tmp_path / "broken_bench.py").write_text("import sys\nprint('no json here')\nsys.exit(3)\n")
    (tmp_path / "prose_bench.py").write_text("print('{\"a\": 1}')\nprint('then prose last')\n")
    (tmp_path / "slow_bench.py").write_text("import time\ntime.sleep(60)\n")
    reg = _registry(
        tmp_path,
        Benchmark("fake", "fake_bench.py", full=("--n", "100"), quick=("--n", "7"),
                  figures=(Figure("total", "<=", 25, "test"), Figure("nested.mean", ">=", 3, "test"), Figure("n", "==", "total", "test"))),
        Benchmark("broken", "broken_bench.py"),
        Benchmark("prose", "prose_bench.py"),
        Benchmark("slow", "slow_bench.py", quick_timeout_s=2),
        Benchmark("big", "fake_bench.py", quick=None, quick_skip="only at full size"),
        Benchmark("artifact", "fake_bench.py", needs=("pollux",)),
        Benchmark("promised", "not_here_bench.py", landing="issue 99"),
    )  # fmt: skip
    out = tmp_path / "results"
    path = runner.run(reg, [], quick=True, out_dir=out, note="test run")
    assert list(out.iterdir()) == [path]
    doc = results.load(path)
    by = {e["name"]: e for e in doc["benchmarks"]}
    assert [e["name"] for e in doc["benchmarks"]] == ["fake", "broken", "prose", "slow", "big", "artifact", "promised"]

    fake = by["fake"]
    n = 7
    total = n * (n - 1) // 2  # 21
    assert fake["status"] == "ok" and fake["exit_code"] == 0
    assert fake["figures"] == {"total": total, "n": n, "nested": {"mean": total / n}, "series": list(range(n))}
    assert fake["command"] == ["python", "-u", "fake_bench.py", "--n", "7"]
    assert fake["wall_s"] > 0
    assert fake["targets"]["total"] == {"op": "<=", "target": 25, "target_expr": None, "direction": "lower is better",
                                        "source": "test", "value": total, "met": total <= 25}  # fmt: skip
    assert fake["targets"]["nested.mean"]["met"] is (total / n >= 3)
    # A relation to another figure of the same run: n == total is false here (7 != 21).
    assert fake["targets"]["n"]["target"] == total and fake["targets"]["n"]["met"] is False

    assert by["broken"]["status"] == "failed" and by["broken"]["exit_code"] == 3 and "no json here" in by["broken"]["output_tail"]
    assert by["prose"]["status"] == "failed" and "not one JSON object" in by["prose"]["reason"]
    assert by["slow"]["status"] == "timeout" and by["slow"]["wall_s"] < 30
    assert by["big"]["status"] == "skipped" and "only at full size" in by["big"]["reason"]
    assert by["artifact"]["status"] == "skipped" and "adaptdl" in by["artifact"]["reason"]
    assert by["promised"]["status"] == "skipped" and "issue 99" in by["promised"]["reason"]

    assert doc["quick"] is True and doc["note"] == "test run" and doc["schema"] == results.SCHEMA
    assert doc["machine"]["cpu_count"] == os.cpu_count()
    assert len(doc["load_avg_before"]) == 3 and len(doc["load_avg_after"]) == 3
    assert doc["commit"]["sha"] is None  # the temporary directory is no git checkout
    assert doc["started_at"].startswith(doc["date"])


def test_full_sizes_and_repeats_give_medians_and_the_spread_compare_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "fake_bench.py").write_text(FAKE)
    (tmp_path / "counter_bench.py").write_text(COUNTER)
    reg = _registry(tmp_path, Benchmark("fake", "fake_bench.py", full=("--n", "100"), quick=("--n", "7")), Benchmark("counter", "counter_bench.py"))
    path = runner.run(reg, ["counter", "fake"], quick=False, out_dir=tmp_path / "r", repeats=4)
    doc = results.load(path)
    by = {e["name"]: e for e in doc["benchmarks"]}
    assert by["fake"]["figures"]["total"] == 100 * 99 // 2
    values = [1, 4, 9, 16]  # the counter script prints k * k on its k-th run
    assert [r["value"] for r in by["counter"]["repeats"]] == values
    assert by["counter"]["figures"]["value"] == (4 + 9) / 2
    # Compare against itself: no change, noise = the IQR of the four runs (exclusive quartiles:
    # q1 at position 1.25 -> 1 + 0.25 * 3, q3 at position 3.75 -> 9 + 0.75 * 7).
    main(["compare", str(path), str(path), "--format", "json", "--all"])
    rows = {(r["benchmark"], r["figure"]): r for r in json.loads(capsys.readouterr().out)["rows"]}
    row = rows[("counter", "value")]
    assert row["noise"] == pytest.approx((9 + 0.75 * 7) - (1 + 0.25 * 3))
    assert row["change_pct"] == 0 and row["within_noise"] is True


def _result(figures_by_bench: dict[str, dict], command: str = "python benchmarks/x.py") -> dict:
    return {"schema": results.SCHEMA, "source": "test", "benchmarks": [
        {"name": n, "status": "ok", "reason": "", "command": command, "figures": f, "targets": {}} for n, f in figures_by_bench.items()]}  # fmt: skip


def test_compare_prints_each_figures_change_noise_and_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Registered figures: allocator's dp_100x400_ms (<= 5) and brute_force_mismatches (== 0);
    # rescale's steady_overhead_pct (<= 5) with its per-round ratio spread as the noise.
    a = _result({
        "allocator": {"dp_100x400_ms": 6.0, "brute_force_mismatches": 0},
        "rescale": {"steady_overhead_pct": 3.0, "steady_ratio_min": 0.98, "steady_ratio_max": 1.06},
        "hpo": {"cost_ratio_vs_static": 0.7},
    })  # fmt: skip
    b = _result({
        "allocator": {"dp_100x400_ms": 4.5, "brute_force_mismatches": 1},
        "rescale": {"steady_overhead_pct": 7.0, "steady_ratio_min": 0.99, "steady_ratio_max": 1.03},
    })  # fmt: skip
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    main(["compare", str(pa), str(pb), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    rows = {(r["benchmark"], r["figure"]): r for r in out["rows"]}
    dp = rows[("allocator", "dp_100x400_ms")]
    assert dp["ratio"] == pytest.approx(4.5 / 6.0) and dp["change_pct"] == pytest.approx((4.5 / 6.0 - 1) * 100)
    assert (dp["met_a"], dp["met_b"], dp["verdict"]) == (False, True, "now met")
    assert dp["noise"] is None
    bf = rows[("allocator", "brute_force_mismatches")]
    assert bf["ratio"] is None and bf["delta"] == 1 and bf["verdict"] == "now missed"
    so = rows[("rescale", "steady_overhead_pct")]
    # Noise in the figure's units: ratios r are (r - 1) x 100 percent; the larger spread counts.
    spread_a, spread_b = (1.06 - 0.98) * 100, (1.03 - 0.99) * 100
    assert so["noise"] == pytest.approx(max(spread_a, spread_b))
    assert so["within_noise"] is (abs(7.0 - 3.0) <= max(spread_a, spread_b))
    assert so["verdict"] == "now missed"
    assert any(n.startswith("hpo: A ok; B absent") for n in out["notes"])

    main(["compare", str(pa), str(pb)])  # the table
    table = capsys.readouterr().out
    assert f"{(4.5 / 6.0 - 1) * 100:+.1f}%" in table and "now met" in table and "no noise estimate" in table


def test_compare_and_run_refuse_bad_input_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for args, needle in ((["compare", str(tmp_path / "nope.json"), "latest"], "nope.json"), (["run", "no_such_bench"], "no_such_bench")):
        proc = subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr and "Traceback" not in proc.stderr


MARKDOWN = """# Benchmarks

Intro prose.

## Allocator

Command: `.venv/bin/python benchmarks/allocator_bench.py --repeats 9`

```
{"dp_100x400_ms": 1.5, "brute_force_mismatches": 0}
```

### Stop 7 re-run (main abc1234), 2026-01-02

`PYTHONPATH=. .venv/bin/python benchmarks/service_bench.py`: `{"submissions_per_s": 900.5, "recovery_s": 4.0}`
and an elided one: `{"dp_100x400_ms": 2.5, "policy_100x400_ms": 3.0, ...}`

| figure | measured | target |
|---|---|---|
| `cost_ratio_vs_static` (median) | **0.61** | <= 0.5 |
| not a figure | 3 | - |
"""


def test_history_parser_keeps_every_json_with_its_stop_commit_and_command(tmp_path: Path) -> None:
    md = tmp_path / "bench.md"
    md.write_text(MARKDOWN)
    written = history.write_history(md, tmp_path / "history", doc="docs/x.md")
    docs = [json.loads(p.read_text()) for p in written]
    assert [d["heading"] for d in docs] == ["(preamble)", "Allocator", "Stop 7 re-run (main abc1234), 2026-01-02"]
    alloc, stop = docs[1], docs[2]
    assert alloc["source"] == "docs/x.md (section 'Allocator')" and alloc["date"] is None
    [entry] = alloc["benchmarks"]
    assert entry["name"] == "allocator" and entry["figures"] == {"dp_100x400_ms": 1.5, "brute_force_mismatches": 0}
    assert entry["command"] == ".venv/bin/python benchmarks/allocator_bench.py --repeats 9"
    assert entry["targets"]["dp_100x400_ms"]["met"] is True  # 1.5 <= 5

    assert stop["source"] == "docs/x.md (stop 7)" and stop["commit"]["sha"] == "abc1234" and stop["date"] == "2026-01-02"
    by = {e["name"]: e for e in stop["benchmarks"]}
    assert by["service"]["figures"] == {"submissions_per_s": 900.5, "recovery_s": 4.0}
    assert by["service"]["command"] == "PYTHONPATH=. .venv/bin/python benchmarks/service_bench.py"
    assert by["allocator"]["elided"] is True and by["allocator"]["figures"] == {"dp_100x400_ms": 2.5, "policy_100x400_ms": 3.0}
    assert by["hpo"]["from_table"] is True and by["hpo"]["figures"] == {"cost_ratio_vs_static": 0.61}
    assert stop["tables"][0][1][0] == "`cost_ratio_vs_static` (median)" and "Stop 7" in stop["notes"]

    # Latest per benchmark: the dated section wins over the undated one for the allocator.
    latest = {e["name"]: e for e in history.latest_per_benchmark(written)["benchmarks"]}
    assert latest["allocator"]["figures"]["dp_100x400_ms"] == 2.5


def test_every_benchmark_script_is_registered_or_excluded() -> None:
    scripts = {f"benchmarks/{p.name}" for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".sh") and not p.name.startswith("__")}
    registered = {b.script for b in BENCHMARKS}
    assert not registered & set(EXCLUDED), "a script is both registered and excluded"
    unaccounted = scripts - registered - set(EXCLUDED)
    assert not unaccounted, f"add these to benchmarks/harness/registry.py (BENCHMARKS or EXCLUDED with a reason): {sorted(unaccounted)}"
    for b in BENCHMARKS:
        assert b.landing or (REPO / b.script).is_file(), f"{b.name}: {b.script} does not exist"
        assert b.quick is not None or b.quick_skip, f"{b.name}: no quick sizes and no reason"
        for f in b.figures:
            assert f.op in (None, "<=", ">=", "=="), (b.name, f.key, f.op)
            assert (f.op is None) == (f.target is None), (b.name, f.key)
    for script in EXCLUDED:
        assert (REPO / script).is_file(), f"EXCLUDED names {script}, which does not exist"
    names = [b.name for b in BENCHMARKS]
    assert len(names) == len(set(names))


def test_history_from_a_git_revision_dates_each_figure_by_the_commit_that_wrote_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    (repo / "bench.md").write_text(MARKDOWN)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "bench.md"], cwd=repo, check=True)
    env = {**os.environ, "GIT_COMMITTER_DATE": "2026-01-05T10:00:00+00:00", "GIT_AUTHOR_DATE": "2026-01-05T10:00:00+00:00"}
    subprocess.run([*git, "commit", "-qm", "figures"], cwd=repo, check=True, env=env)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    (repo / "bench.md").write_text("# rewritten\n")  # the revision is read, not the working file
    written = history.write_history(repo / "bench.md", tmp_path / "history", rev=sha)
    entries = [e for p in written for e in json.loads(p.read_text())["benchmarks"]]
    assert len(entries) == 4
    assert {e["recorded"]["commit"] for e in entries} == {sha}
    assert {e["recorded"]["at"] for e in entries} == {"2026-01-05T10:00:00+00:00"}


def test_table_shows_each_registered_figure_with_its_last_value_and_where_it_came_from(tmp_path: Path) -> None:
    md = tmp_path / "bench.md"
    md.write_text(MARKDOWN)
    history.write_history(md, tmp_path / "history")
    quick = tmp_path / "quick.json"
    quick.write_text(json.dumps({**_result({"allocator": {"dp_100x400_ms": 9.25}}), "quick": True, "date": "2026-02-01"}))
    rows = {line.split(" | ")[1]: line for line in table.markdown(tmp_path / "history", [], quick).splitlines()[2:]}
    assert len(rows) == sum(len(b.figures) for b in BENCHMARKS)
    # The dated stop-7 section holds the newest full-size value (2.5, met: <= 5); the quick run
    # (other sizes than the registry's full ones) is shown beside it, not as the last value.
    assert rows["`dp_100x400_ms`"].startswith("| allocator | `dp_100x400_ms` | <= 5 | 2.5 ✓ |")
    assert "2026-01-02, abc1234, stop 7" in rows["`dp_100x400_ms`"] and rows["`dp_100x400_ms`"].endswith("| 9.25 |")
    assert "0.61 ✗" in rows["`cost_ratio_vs_static`"]  # 0.61 > 0.5
