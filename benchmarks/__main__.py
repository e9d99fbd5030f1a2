"""python -m benchmarks list | run [--quick] [--out DIR] [--repeats N] [NAME...] | compare A B | table | history.

``run`` writes one results file per run under benchmarks/results/ (see
benchmarks/harness/results.py for the schema); ``compare A B`` takes paths or ``latest`` /
``previous`` (the runner's newest runs) or ``history`` (each benchmark's last figures recorded
in benchmarks/results/history/, the measurements that docs/benchmarks.md used to hold).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table

from benchmarks.harness import compare as cmp
from benchmarks.harness import history, results, runner, table
from benchmarks.harness.registry import BENCHMARKS, Registry


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        print(f"benchmarks: {message}", file=sys.stderr)
        raise SystemExit(2)


def _fail(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(2)


def cmd_list(console: Console) -> None:
    table = Table("name", "script", "quick args", "needs", "headline figures (target)")
    for b in BENCHMARKS:
        quick = " ".join(b.quick) if b.quick is not None else f"[dim]none: {b.quick_skip}[/dim]"
        figs = ", ".join(f"{f.key} {f.op} {f.target}" if f.op else f.key for f in b.figures)
        table.add_row(b.name, b.script + (f" [dim](lands with {b.landing})[/dim]" if b.landing else ""), quick or "(defaults)", ", ".join(b.needs) or "—", figs)
    console.print(table)


def cmd_run(args: argparse.Namespace, console: Console, registry: Registry) -> None:
    unknown = [n for n in args.names if registry.get(n) is None]
    if unknown:
        _fail(f"benchmarks run: NAME {unknown[0]!r} is not a benchmark (python -m benchmarks list)")
    if args.repeats < 1:
        _fail(f"benchmarks run: --repeats {args.repeats} must be >= 1")
    out = Path(args.out) if args.out else results.RESULTS

    def progress(bench: Any, entry: dict[str, Any] | None) -> None:
        if entry is None:
            console.print(f"[bold]{bench.name}[/bold] …", end=" ")
            return
        colour = {"ok": "green", "skipped": "yellow"}.get(entry["status"], "red")
        wall = f" {entry['wall_s']:.1f} s" if entry["wall_s"] is not None else ""
        console.print(f"[{colour}]{entry['status']}[/{colour}]{wall}" + (f" — {entry['reason']}" if entry["reason"] else ""))
        misses = [k for k, t in entry.get("targets", {}).items() if t["met"] is False]
        if misses:
            console.print(f"    [red]targets missed:[/red] {', '.join(misses)}")

    with console.status("running benchmarks"):
        path = runner.run(registry, args.names, args.quick, out, args.repeats, args.note, progress)
    doc = results.load(path)
    console.print(f"wrote {path} ({doc['wall_s']} s; load average {doc['load_avg_before']} → {doc['load_avg_after']})")
    if any(e["status"] in ("failed", "timeout") for e in doc["benchmarks"]):
        raise SystemExit(1)


def _resolve(ref: str) -> tuple[dict[str, Any], str]:
    try:
        if ref == "history":
            return history.latest_per_benchmark(results.history()), "history (each figure's last recorded value)"
        path = results.resolve(ref)
        return results.load(path), str(path)
    except (FileNotFoundError, ValueError) as e:
        _fail(f"benchmarks compare: {e}")


def cmd_compare(args: argparse.Namespace, console: Console) -> None:
    a, a_name = _resolve(args.a)
    b, b_name = _resolve(args.b)
    rows, notes = cmp.compare(a, b, every=args.all)
    if args.format == "json":
        print(json.dumps(cmp.as_json(rows, notes, a_name, b_name), indent=1))
        return
    table = Table("benchmark", "figure", "A", "B", "change", "noise", "target", "verdict", title=f"A = {a_name}\nB = {b_name}")
    for r in rows:
        colour = {"now met": "green", "now missed": "red", "missed": "red"}.get(r.verdict, "")
        verdict = f"[{colour}]{r.verdict}[/{colour}]" if colour else r.verdict
        table.add_row(r.benchmark, r.figure, cmp.fmt(r.a), cmp.fmt(r.b), cmp.change_text(r), cmp.noise_text(r), r.target, verdict)
    console.print(table)
    for note in notes:
        console.print(f"[dim]{note}[/dim]")


def cmd_history(args: argparse.Namespace, console: Console) -> None:
    try:
        written = history.write_history(Path(args.markdown), results.RESULTS / "history", rev=args.rev)
    except (OSError, subprocess.CalledProcessError) as e:
        _fail(f"benchmarks history: {args.markdown} at --rev {args.rev}: {getattr(e, 'stderr', '') or e}".strip())
    console.print(f"wrote {len(written)} history entries under {results.RESULTS / 'history'}")


def cmd_table(args: argparse.Namespace) -> None:
    quick = None
    if args.quick:
        try:
            quick = results.resolve(args.quick)
        except FileNotFoundError as e:
            _fail(f"benchmarks table: {e}")
    full = [p for p in results.runs() if p != quick]
    print(table.markdown(results.RESULTS / "history", full, quick))


def main(argv: list[str] | None = None) -> None:
    p = _Parser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sub.add_parser("list", help="every registered benchmark, its quick sizes, needs and targets")
    r = sub.add_parser("run", help="run benchmarks, write one results file")
    r.add_argument("--quick", action="store_true", help="each script's small sizes (the whole run: <= 10 min on 2 cores)")
    r.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    r.add_argument("--repeats", type=int, default=1, help="run each benchmark N times (the spread is the noise)")
    r.add_argument("--note", default="", help="free text stored with the run (e.g. what else the box was doing)")
    r.add_argument("names", nargs="*", metavar="NAME")
    c = sub.add_parser("compare", help="compare two results files")
    c.add_argument("a", help="path, latest, previous, history or history:N")
    c.add_argument("b", help="path, latest, previous, history or history:N")
    c.add_argument("--format", choices=["table", "json"], default="table")
    c.add_argument("--all", action="store_true", help="every numeric figure, not only the registered ones")
    h = sub.add_parser("history", help="re-parse a markdown of per-stop prose into benchmarks/results/history/")
    h.add_argument("markdown", help="the markdown (docs/benchmarks.md as it was: use --rev)")
    h.add_argument("--rev", default=None, help="read the markdown at this git revision and date each entry by git blame")
    t = sub.add_parser("table", help="the current-figures table of docs/benchmarks.md, as markdown")
    t.add_argument("--quick", default=None, help="a quick run's results to show beside (path or latest)")
    args = p.parse_args(argv)
    # Into a pipe or a file, rich would wrap the table at 80 columns: keep one row per line.
    console = Console() if sys.stdout.isatty() else Console(width=220)
    if args.cmd == "list":
        cmd_list(console)
    elif args.cmd == "run":
        cmd_run(args, console, Registry())
    elif args.cmd == "compare":
        cmd_compare(args, console)
    elif args.cmd == "table":
        cmd_table(args)
    else:
        cmd_history(args, console)


if __name__ == "__main__":
    main()
