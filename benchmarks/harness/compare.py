"""Compare two results files figure by figure: A, B, the change, the noise beside it, targets.

The change is B / A (and B - A where A is 0 or the figure is a count). The noise is what
the runs themselves report: the spread over ``--repeats`` runs (interquartile range with 4 or
more, min-max below), or the figure's own spread key from the registry (per-round ratios, a
per-event maximum); a figure without one says "no noise estimate". A change smaller than the
larger of the two runs' spreads is marked "within noise".
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.harness import results
from benchmarks.harness.registry import BY_NAME, Figure


@dataclass(frozen=True)
class Row:
    benchmark: str
    figure: str
    a: Any
    b: Any
    ratio: float | None  # b / a
    change_pct: float | None  # (b / a - 1) x 100
    delta: float | None  # b - a
    noise: float | None  # the larger run's spread, in the figure's units (high - low)
    noise_source: str
    within_noise: bool | None
    target: str  # "<= 5 (docs/benchmarks.md)" or ""
    met_a: bool | None
    met_b: bool | None
    verdict: str  # "now met", "now missed", "met", "missed", ""


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def spread(entry: dict[str, Any], fig: Figure | None, key: str) -> tuple[float | None, str]:
    """The run's own noise for one figure: (high - low, where it came from)."""
    reps = entry.get("repeats") or []
    values = [v for v in (_num(results.lookup(r, key)) for r in reps) if v is not None]
    if len(values) >= 4:
        q = statistics.quantiles(values, n=4)
        return q[2] - q[0], f"IQR of {len(values)} repeats"
    if len(values) >= 2:
        return max(values) - min(values), f"range of {len(values)} repeats"
    if fig is None or not fig.noise:
        return None, ""
    figures = entry.get("figures") or {}
    parts = fig.noise.split(",")
    if len(parts) == 2:
        lo, hi = _num(results.lookup(figures, parts[0])), _num(results.lookup(figures, parts[1]))
    else:
        pair = results.lookup(figures, parts[0])
        value = _num(results.lookup(figures, key))
        if isinstance(pair, list) and len(pair) == 2:
            lo, hi = _num(pair[0]), _num(pair[1])
        elif _num(pair) is not None and value is not None:
            lo, hi = min(value, _num(pair)), max(value, _num(pair))  # a median beside its maximum
        else:
            lo = hi = None
    if lo is None or hi is None:
        return None, ""
    if fig.noise_as == "ratio_pct":
        lo, hi = (lo - 1) * 100, (hi - 1) * 100
    return abs(hi - lo), f"run's own spread ({fig.noise})"


def _verdict(met_a: bool | None, met_b: bool | None) -> str:
    if met_b is None:
        return ""
    if met_a is None or met_a == met_b:
        return "met" if met_b else "missed"
    return "now met" if met_b else "now missed"


def _keys(name: str, ea: dict[str, Any], eb: dict[str, Any], every: bool) -> list[str]:
    bench = BY_NAME.get(name)
    named = [f.key for f in bench.figures] if bench else []
    fa, fb = results.flatten(ea.get("figures") or {}), results.flatten(eb.get("figures") or {})
    rest = [k for k in fb if k in fa and k not in named and _num(fb[k]) is not None]
    keys = [k for k in named if k in fa or k in fb or results.lookup(ea.get("figures") or {}, k) is not None]
    return keys + rest if every or not named else keys


def _argv(command: Any) -> str:
    """A command's script and arguments, however it was written (argv list or a shell line)."""
    if not command:
        return ""
    words = command if isinstance(command, list) else str(command).split()
    for i, w in enumerate(words):
        if w.endswith(".py"):
            return " ".join(words[i:])
    return " ".join(words)


def compare(a: dict[str, Any], b: dict[str, Any], every: bool = False) -> tuple[list[Row], list[str]]:
    """Rows for every figure both files could show; notes for benchmarks one side lacks."""
    by_a = {e["name"]: e for e in a["benchmarks"]}
    by_b = {e["name"]: e for e in b["benchmarks"]}
    rows: list[Row] = []
    notes: list[str] = []
    for name in [*by_b, *(n for n in by_a if n not in by_b)]:
        ea, eb = by_a.get(name), by_b.get(name)
        if ea is None or eb is None or ea.get("status") != "ok" or eb.get("status") != "ok":
            sa = "absent" if ea is None else f"{ea.get('status')}{': ' + ea['reason'] if ea.get('reason') else ''}"
            sb = "absent" if eb is None else f"{eb.get('status')}{': ' + eb['reason'] if eb.get('reason') else ''}"
            notes.append(f"{name}: A {sa}; B {sb}")
            if ea is None or eb is None or not ea.get("figures") or not eb.get("figures"):
                continue
        if _argv(ea.get("command")) != _argv(eb.get("command")):
            notes.append(f"{name}: other sizes or options (A: {_argv(ea.get('command')) or '?'}; B: {_argv(eb.get('command')) or '?'})")
        bench = BY_NAME.get(name)
        for key in _keys(name, ea, eb, every):
            fig = next((f for f in bench.figures if f.key == key), None) if bench else None
            va, vb = results.lookup(ea["figures"], key), results.lookup(eb["figures"], key)
            na, nb = _num(va), _num(vb)
            ratio = nb / na if na not in (None, 0.0) and nb is not None else None
            delta = nb - na if na is not None and nb is not None else None
            noise_a, src_a = spread(ea, fig, key)
            noise_b, src_b = spread(eb, fig, key)
            noise = max((n for n in (noise_a, noise_b) if n is not None), default=None)
            src = src_b if noise_b is not None and noise == noise_b else src_a
            ta, tb = (ea.get("targets") or {}).get(key), (eb.get("targets") or {}).get(key)
            if fig is not None and fig.op is not None and tb is None:  # a history entry: evaluate now
                tb = results.targets_for(bench, eb["figures"]).get(key)
            if fig is not None and fig.op is not None and ta is None:
                ta = results.targets_for(bench, ea["figures"]).get(key)
            target = f"{fig.op} {fig.target}" + (f" ({fig.source})" if fig.source else "") if fig is not None and fig.op else ""
            met_a, met_b = (ta or {}).get("met"), (tb or {}).get("met")
            rows.append(Row(
                name, key, va, vb, ratio, None if ratio is None else (ratio - 1) * 100, delta, noise, src,
                None if noise is None or delta is None else abs(delta) <= noise, target, met_a, met_b, _verdict(met_a, met_b),
            ))  # fmt: skip
    return rows, notes


def as_json(rows: list[Row], notes: list[str], a_path: str, b_path: str) -> dict[str, Any]:
    return {"a": a_path, "b": b_path, "rows": [asdict(r) for r in rows], "notes": notes}


def fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float) and abs(v) >= 1e4:
        return f"{v:,.0f}"  # 12,048, not 1.205e+04
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def change_text(r: Row) -> str:
    if r.ratio is not None:
        return f"{r.change_pct:+.1f}% (×{r.ratio:.3g})"
    if r.delta is not None:
        return f"{r.delta:+.4g}"
    if r.a is None or r.b is None:
        return "only in B" if r.a is None else "only in A"
    return "same" if r.a == r.b else f"{fmt(r.a)} → {fmt(r.b)}"


def noise_text(r: Row) -> str:
    if r.noise is None:
        return "no noise estimate"
    return f"±{r.noise / 2:.3g} ({'within' if r.within_noise else 'beyond'}; {r.noise_source})"
