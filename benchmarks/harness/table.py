"""The current-figures table of docs/benchmarks.md, as markdown, from the results data.

Per registered figure: its target, the last value recorded at full size (the newest history
entry or full run holding it) with the command, date and commit that produced it, and the
value of a ``--quick`` run beside it when one is given (small sizes: a smoke, not the claim).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness import compare, history, results
from benchmarks.harness.registry import BENCHMARKS, BY_NAME


def _last_full(docs: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[Any, dict[str, Any], dict[str, Any]]]:
    """(benchmark, figure) -> (value, entry, its document), the newest by (date, order) wins."""
    best: dict[tuple[str, str], tuple[tuple[str, int, int], Any, dict[str, Any], dict[str, Any]]] = {}
    for order, doc in enumerate(docs):
        for n, entry in enumerate(doc.get("benchmarks", [])):
            bench = BY_NAME.get(entry["name"])
            # A quick run counts where its sizes are the full ones (its script has no smaller).
            if entry.get("status") != "ok" or (doc.get("quick") and (bench is None or bench.quick != bench.full)):
                continue
            for key, value in results.flatten(entry.get("figures") or {}).items():
                rank = (history.rank(doc, entry), order, n)
                if (entry["name"], key) not in best or rank >= best[(entry["name"], key)][0]:
                    best[(entry["name"], key)] = (rank, value, entry, doc)
    return {k: (v, e, d) for k, (_, v, e, d) in best.items()}


def _where(entry: dict[str, Any], doc: dict[str, Any]) -> str:
    """The date and commit written with the figure, else when and in which commit its line entered
    the doc (``recorded``), and the stop."""
    rec = entry.get("recorded") or {}
    written = (doc.get("commit") or {}).get("sha")
    sha = written[:7] if written else (f"doc {rec['commit'][:7]}" if rec.get("commit") else None)
    src = doc.get("source", "")
    stop = src[src.find("(") + 1 : -1] if "(stop" in src else ""
    date = doc.get("date") or (rec.get("at") or "")[:10] or None
    bits = [b for b in (date, sha, stop) if b]
    return ", ".join(bits) or "undated"


def _command(entry: dict[str, Any]) -> str:
    cmd = compare._argv(entry.get("command"))
    return f"`{cmd}`" if cmd else "—"


def markdown(history_dir: Path, runs: list[Path], quick: Path | None) -> str:
    docs = [results.load(p) for p in [*sorted(history_dir.glob("*.json")), *runs, *([quick] if quick else [])]]
    last = _last_full(docs)
    quick_doc = results.load(quick) if quick else None
    quick_by = {e["name"]: e for e in quick_doc["benchmarks"]} if quick_doc else {}
    head = "| benchmark | figure | target | last value (full size) | command | date, commit, stop | quick run |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for bench in BENCHMARKS:
        for fig in bench.figures:
            target = f"{fig.op} {fig.target}" if fig.op else "—"
            got = last.get((bench.name, fig.key))
            value, cmd, where = ("—", "—", "not recorded") if got is None else (compare.fmt(got[0]), _command(got[1]), _where(got[1], got[2]))
            if got is not None and fig.op:
                target_value = results.targets_for(bench, got[1]["figures"]).get(fig.key, {})
                value += {True: " ✓", False: " ✗"}.get(target_value.get("met"), "")
            q = quick_by.get(bench.name)
            qv = "—" if q is None else (compare.fmt(results.lookup(q["figures"], fig.key)) if q["status"] == "ok" else q["status"])
            key = fig.key.replace("|", "\\|")  # a pipe would end the markdown cell
            lines.append(f"| {bench.name} | `{key}` | {target} | {value} | {cmd} | {where} | {qv} |")
    return "\n".join(lines)
