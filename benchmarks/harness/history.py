"""The measurements docs/benchmarks.md held as per-stop prose, turned into results files.

Each section of the markdown (a ``##`` or ``###`` heading and its text) becomes one results
file under benchmarks/results/history/, in the runner's schema, with ``source`` naming the doc
and the stop (or the heading when no stop is written). Every JSON object in it (a fenced line
or an inline code span: a benchmark's last line pasted in) becomes one benchmark entry, with
the command, commit and date written nearest to it; a JSON cut short with ``...`` keeps what
was printed and is flagged ``elided``. Table rows whose first cell is a registered figure
(```key``` followed by a number) fill in a benchmark that has no JSON in that section. The
section's markdown is kept whole (``notes``) and its tables as rows (``tables``), so nothing
the doc recorded is lost.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import results
from benchmarks.harness.registry import BENCHMARKS, by_script

HEADING = re.compile(r"^(#{2,3}) (.*)$")
STOP = re.compile(r"\b[Ss]top (\d+)\b")
DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")
SHA = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)([0-9a-f]{7,40})\b")
COMMAND = re.compile(r"`([^`]*?benchmarks/(\w+\.py)[^`]*)`", re.S)
NUMBER = re.compile(r"[−-]?\d[\d,]*(?:\.\d+)?")
# JSON lines that name no registered figure: a key only that benchmark prints.
SIGNATURES = {"pollux_published_avg_jct_s": "pollux_trace", "target_loss": "goodput_real", "generations_a": "growth",
              "profiler_iter_s": "sim_vs_real", "mode": "sim_vs_real", "hardware": "profile", "inplace_scale_out_s": "rescale"}  # fmt: skip


def parse_json(text: str) -> tuple[dict[str, Any] | None, bool]:
    """(the object, whether it was elided with '...'); None when the text is not a JSON object."""
    text = text.strip()
    elided = bool(re.search(r",\s*\.\.\.\s*}$", text))
    if elided:
        text = re.sub(r",\s*\.\.\.\s*}$", "}", text)
    try:
        value = json.loads(text)
    except ValueError:
        return None, False
    return (value, elided) if isinstance(value, dict) else (None, False)


def sections(markdown: str) -> list[dict[str, Any]]:
    """Split at ## / ### headings: each with its heading, its parent ## heading and its text."""
    out: list[dict[str, Any]] = []
    parent = ""
    current: dict[str, Any] = {"heading": "(preamble)", "parent": "", "lines": [], "start": 0}
    fenced = False
    for number, line in enumerate(markdown.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        m = HEADING.match(line) if not fenced else None
        if m:
            out.append(current)
            if m.group(1) == "##":
                parent = m.group(2)
            current = {"heading": m.group(2), "parent": parent if m.group(1) == "###" else "", "lines": [], "start": number}
        current["lines"].append(line)
    out.append(current)
    return [s for s in out if any(line.strip() for line in s["lines"])]


def json_spans(text: str) -> list[tuple[int, str]]:
    """(offset, text) of every JSON object pasted in: a line of a fenced block, or an inline code span."""
    found: list[tuple[int, str]] = []
    fenced = False
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and line.lstrip().startswith("{"):
            found.append((offset, line))
        elif not fenced:
            for m in re.finditer(r"`(\{\"[^`]*\})`", line):
                found.append((offset + m.start(), m.group(1)))
        offset += len(line)
    return found


def guess_benchmark(figures: dict[str, Any], command: str | None) -> str | None:
    """By the registered figures the line names (a command nearby may be another script's),
    then by the command's script, then by a key only one benchmark prints."""
    keys = set(results.flatten(figures))
    best, score = None, 0
    for b in BENCHMARKS:
        n = len(keys & {f.key for f in b.figures})
        if n > score:
            best, score = b.name, n
    if best:
        return best
    m = re.search(r"benchmarks/(\w+\.py)", command or "")
    bench = by_script(f"benchmarks/{m.group(1)}") if m else None
    return bench.name if bench else next((name for key, name in SIGNATURES.items() if key in figures), None)


def command_for(script: str | None, before: str, section: str) -> str | None:
    """The last command written before the line that runs this benchmark's script (else the
    section's first such command)."""
    if script is None:
        return None
    found = [c for c, s in COMMAND.findall(before) if f"benchmarks/{s}" == script]
    found = found or [c for c, s in COMMAND.findall(section) if f"benchmarks/{s}" == script]
    return " ".join(found[-1].split()) if found else None


def tables(text: str) -> list[list[list[str]]]:
    out: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            out.append(rows)
            rows = []
    return out


def table_figures(rows: list[list[str]]) -> dict[str, dict[str, float]]:
    """Registered figures read off table rows: {benchmark: {key: first number of the next cell}}."""
    keys = {f.key: b.name for b in BENCHMARKS for f in b.figures}
    out: dict[str, dict[str, float]] = {}
    for row in rows[1:]:
        m = re.match(r"`([^`]+)`", row[0]) if len(row) >= 2 else None
        if not m or m.group(1) not in keys:
            continue
        num = NUMBER.search(row[1].replace("**", ""))
        if num:
            out.setdefault(keys[m.group(1)], {})[m.group(1)] = float(num.group(0).replace(",", "").replace("−", "-"))
    return out


def blame(markdown: Path, rev: str) -> list[dict[str, str]]:
    """Per line of the file at ``rev``: the commit that wrote it and when (the date a figure
    entered the doc, for the lines the doc itself left undated)."""
    out = subprocess.run(["git", "blame", "--line-porcelain", rev, "--", markdown.name], cwd=markdown.resolve().parent,
                         capture_output=True, text=True, check=True, timeout=120).stdout  # fmt: skip
    lines: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith("\t"):
            lines.append(current)
            current = {}
        elif re.match(r"^[0-9a-f]{40} ", line):
            current = {"commit": line[:40]}
        elif line.startswith("committer-time "):
            current["at"] = datetime.fromtimestamp(int(line.split()[1]), UTC).isoformat(timespec="seconds")
        elif line.startswith("summary "):
            current["summary"] = line[8:]
    return lines


def _recorded(blamed: list[dict[str, str]] | None, line: int) -> dict[str, str] | None:
    return blamed[line] if blamed and 0 <= line < len(blamed) else None


def entry_of(section: dict[str, Any], index: int, doc: str, blamed: list[dict[str, str]] | None = None) -> dict[str, Any]:
    text = "\n".join(section["lines"])
    head = f"{section['parent']} {section['heading']}"
    stop = STOP.search(section["heading"]) or STOP.search(section["parent"])
    date = DATE.search(section["heading"]) or DATE.search(text)
    sha = SHA.search(section["heading"]) or SHA.search(text)
    where = f"stop {stop.group(1)}" if stop else f"section {section['heading']!r}"
    benchmarks: list[dict[str, Any]] = []
    for offset, span in json_spans(text):
        figures, elided = parse_json(span)
        if figures is None:
            continue
        before = text[:offset]
        nearest = COMMAND.findall(before) or COMMAND.findall(head)
        name = guess_benchmark(figures, nearest[-1][0] if nearest else None) or "unknown"
        bench = next((b for b in BENCHMARKS if b.name == name), None)
        command = command_for(bench.script if bench else None, before, text + head)
        benchmarks.append({
            "recorded": _recorded(blamed, section["start"] + before.count("\n")),
            "name": name, "script": bench.script if bench else None, "command": command, "status": "ok",
            "reason": "elided: the doc printed part of the line" if elided else "", "exit_code": None, "wall_s": figures.get("wall_s"),
            "figures": figures, "targets": results.targets_for(bench, figures) if bench else {}, "output_tail": "", "elided": elided,
        })  # fmt: skip
    rows = tables(text)
    have = {b["name"] for b in benchmarks}
    for table in rows:
        for name, figs in table_figures(table).items():
            if name in have:
                continue
            have.add(name)
            bench = next(b for b in BENCHMARKS if b.name == name)
            row = next((i for i, line in enumerate(section["lines"]) if line.startswith(f"| `{next(iter(figs))}`")), 0)
            benchmarks.append({
                "recorded": _recorded(blamed, section["start"] + row),
                "name": name, "script": bench.script, "command": command_for(bench.script, text, text),
                "status": "ok", "reason": "figures read from the doc's table", "exit_code": None, "wall_s": None, "figures": figs,
                "targets": results.targets_for(bench, figs), "output_tail": "", "from_table": True,
            })  # fmt: skip
    return {
        "schema": results.SCHEMA, "source": f"{doc} ({where})", "index": index, "heading": section["heading"],
        "parent": section["parent"], "started_at": None, "date": date.group(1) if date else None,
        "commit": {"sha": sha.group(1) if sha else None, "dirty": None},
        "machine": {"cpu_count": 2, "cpu_model": None, "python": None, "torch": None, "platform": None, "as_written": "the doc's development machine unless the notes say otherwise"},
        "load_avg_before": None, "load_avg_after": None, "nice": None, "quick": None, "wall_s": None,
        "note": "", "benchmarks": benchmarks, "tables": rows, "notes": text,
    }  # fmt: skip


def parse(markdown: str, doc: str = "docs/benchmarks.md", blamed: list[dict[str, str]] | None = None) -> list[dict[str, Any]]:
    return [entry_of(s, i, doc, blamed) for i, s in enumerate(sections(markdown), start=1)]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "section"


def write_history(markdown: Path, out_dir: Path, doc: str = "docs/benchmarks.md", rev: str | None = None) -> list[Path]:
    """Parse ``markdown`` into out_dir; with ``rev``, the file is read from git at that revision
    and every entry carries the commit and time that wrote its line (``recorded``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    text = markdown.read_text() if rev is None else subprocess.run(
        ["git", "show", f"{rev}:./{markdown.name}"], cwd=markdown.resolve().parent, capture_output=True, text=True, check=True).stdout  # fmt: skip
    for entry in parse(text, doc, blame(markdown, rev) if rev else None):
        path = out_dir / f"{entry['index']:03d}-{slug(entry['heading'])}.json"
        path.write_text(json.dumps(entry, indent=1, ensure_ascii=False) + "\n")
        written.append(path)
    return written


def rank(doc: dict[str, Any], entry: dict[str, Any]) -> str:
    """When a measurement was made, as far as the data says: the time its line entered the doc,
    else the run's start, else the date written beside it. The start before the date: a run's
    date is its day only, and ``"2026-11-28"`` sorts before any time of that day a history line has."""
    return (entry.get("recorded") or {}).get("at") or doc.get("started_at") or doc.get("date") or ""


def latest_per_benchmark(paths: list[Path]) -> dict[str, Any]:
    """One results object holding, per benchmark, each figure's newest recorded value (by
    ``rank``, then by order in the doc): entries are laid over each other oldest first, so a
    section that re-measured a few figures (a table) keeps the older ones of the rest.
    ``figure_sources`` names where each figure came from."""
    found: list[tuple[tuple[str, int, int], dict[str, Any], dict[str, Any]]] = []
    for path in paths:
        doc = json.loads(path.read_text())
        for n, entry in enumerate(doc.get("benchmarks", [])):
            if entry.get("status") == "ok":
                found.append(((rank(doc, entry), doc.get("index", 0), n), entry, doc))
    merged: dict[str, dict[str, Any]] = {}
    for _, entry, doc in sorted(found, key=lambda t: t[0]):
        where = {"source": doc["source"], "date": doc.get("date"), "commit": doc.get("commit", {}).get("sha"), "command": entry.get("command")}
        into = merged.setdefault(entry["name"], {**entry, "figures": {}, "figure_sources": {}})
        into.update({k: v for k, v in entry.items() if k not in ("figures", "targets")})
        into["figures"] = {**into["figures"], **entry["figures"]}
        into["figure_sources"] = {**into["figure_sources"], **{k: where for k in entry["figures"]}}
        into["from"] = where
    for entry in merged.values():
        entry.pop("targets", None)  # the oldest entry's verdicts: compare judges the merged figures anew
    return {"schema": results.SCHEMA, "source": "benchmarks/results/history (latest per figure)", "benchmarks": list(merged.values())}
