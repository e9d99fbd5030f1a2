"""Idle-node traces: when each node of a machine becomes idle (joins N) or busy (leaves N).

Format — a CSV file with the header ``time_s,node,state``; one row per change, ``time_s``
seconds since the trace starts (finite, >= 0), ``node`` a name without commas, ``state``
``idle`` or ``busy``. Every node is busy before its first row; a node turns idle only when
busy and busy only when idle. Rows may come in any order; they are replayed by time, ties
in file order. All rows at one time form one *event* (the paper's definition, Sec. 2.1).

The generator follows what seed 003 reports for Summit (Sec. 2.1, Table 1, Fig. 1, Fig. 6):

* fragment (idle period) lengths: 58 % of fragments are shorter than 10 min and those
  carry ~10 % of the idle node-time. A lognormal fits both exactly: with
  P(L < 10) = Phi((ln 10 - mu)/sigma) = 0.58 and the node-time share below 10 min
  Phi((ln 10 - mu)/sigma - sigma) = 0.10, sigma = 0.202 + 1.2816 = 1.483 and
  mu = ln 10 - 0.202 sigma = 2.003 (minutes): median 7.4 min, mean 22.3 min;
* join events (>= 1 node becomes idle) at 41.7 per hour and leave events at 28.6 per hour
  (Table 1, Summit INC/h and DEC/h), Poisson;
* about 10 % of the machine idle on average (Table 1: 11.1 %; Sec. 2.1: 8.6 % over the two
  weeks; Fig. 6: 2-17 % per 12 h), which with the rates above sets the nodes per join event
  (geometric, mean = idle fraction x nodes / (joins per hour x mean fragment hours));
* leaves are grouped: a node whose drawn fragment has ended leaves at the next leave
  event (the main scheduler starts a job on several idle nodes at once), which lengthens
  fragments by the leave-event gap (~2 min on average). The lengths drawn before that
  grouping therefore use mu = 1.60, sigma = 1.75 (calibrated on a 48 h, 1024-node trace so
  that the *measured* fragments give 58.8 % under 10 min carrying 11.2 % of the node-time);
  ``trace_stats`` measures what came out.

The defaults are the paper's simulation setting: 1024 nodes for a week (Sec. 4.3).
"""

from __future__ import annotations

import csv
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# the exact lognormal fit of the paper's two numbers (for reference) ...
PAPER_FIT_MU_LN_MIN, PAPER_FIT_SIGMA = 2.003, 1.483
# ... and the drawn-length parameters that reproduce them after leave grouping
FRAGMENT_MU_LN_MIN = 1.60
FRAGMENT_SIGMA = 1.75
JOINS_PER_HOUR = 41.7
LEAVES_PER_HOUR = 28.6
IDLE_FRACTION = 0.10


@dataclass(frozen=True, slots=True)
class NodeChange:
    time: float
    node: str
    idle: bool


@dataclass(frozen=True, slots=True)
class IdleTrace:
    """Node changes sorted by time (ties keep input order); validated as a sequence of states."""

    changes: tuple[NodeChange, ...]

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.changes, key=lambda c: c.time))  # stable: ties keep order
        object.__setattr__(self, "changes", ordered)
        idle: set[str] = set()
        for i, c in enumerate(ordered):
            if not (math.isfinite(c.time) and c.time >= 0):
                raise ValueError(f"IdleTrace.changes[{i}].time={c.time!r}: must be a finite number >= 0")
            if c.idle == (c.node in idle):
                raise ValueError(f"IdleTrace.changes[{i}]: node {c.node!r} is already {'idle' if c.idle else 'busy'} at time {c.time}")
            (idle.add if c.idle else idle.discard)(c.node)

    def events(self) -> list[tuple[float, tuple[NodeChange, ...]]]:
        """Changes grouped by time: the paper's events."""
        out: list[tuple[float, list[NodeChange]]] = []
        for c in self.changes:
            if out and out[-1][0] == c.time:
                out[-1][1].append(c)
            else:
                out.append((c.time, [c]))
        return [(t, tuple(cs)) for t, cs in out]

    @property
    def end_time(self) -> float:
        return self.changes[-1].time if self.changes else 0.0


def load_trace(path: str | Path) -> IdleTrace:
    """Read the CSV format above; errors name the file, line and column."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO would block, a device never end
        raise ValueError(f"trace={str(path)!r}: not a regular file")
    if path.is_file() and path.stat().st_size > 2**30:
        raise ValueError(f"trace={str(path)!r}: {path.stat().st_size:,} bytes, more than a trace may hold (1 GiB)")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"trace={str(path)!r}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"trace={str(path)!r}: not UTF-8 text (byte {exc.start}); is it a binary file?") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or [h.strip() for h in rows[0]] != ["time_s", "node", "state"]:
        raise ValueError(f"{path}: line 1: header must be 'time_s,node,state', got {','.join(rows[0]) if rows else '(empty file)'!r}")
    changes = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or all(not f.strip() for f in row):
            continue
        if len(row) != 3:
            raise ValueError(f"{path}: line {line}: expected 3 columns (time_s,node,state), got {len(row)}")
        t_raw, node, state = (f.strip() for f in row)
        try:
            t = float(t_raw)
        except ValueError:
            raise ValueError(f"{path}: line {line}, column time_s: {t_raw!r} is not a number") from None
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"{path}: line {line}, column time_s: {t_raw!r} must be finite and >= 0")
        if not node:
            raise ValueError(f"{path}: line {line}, column node: empty node name")
        if state not in ("idle", "busy"):
            raise ValueError(f"{path}: line {line}, column state: {state!r} is not 'idle' or 'busy'")
        changes.append(NodeChange(t, node, state == "idle"))
    try:
        return IdleTrace(tuple(changes))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def write_trace(trace: IdleTrace, path: str | Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time_s", "node", "state"])
        for c in trace.changes:
            w.writerow([repr(round(c.time, 3)), c.node, "idle" if c.idle else "busy"])


def generate_trace(
    rng: np.random.Generator,
    nodes: int = 1024,
    hours: float = 168.0,
    joins_per_hour: float = JOINS_PER_HOUR,
    leaves_per_hour: float = LEAVES_PER_HOUR,
    idle_fraction: float = IDLE_FRACTION,
    mu_ln_min: float = FRAGMENT_MU_LN_MIN,
    sigma: float = FRAGMENT_SIGMA,
) -> IdleTrace:
    """A synthetic Summit-like trace (see the module docstring for every number's source)."""
    for name, v in (("nodes", nodes), ("hours", hours), ("joins_per_hour", joins_per_hour), ("leaves_per_hour", leaves_per_hour)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name}={v!r}: must be a finite number > 0")
    if not 0 < idle_fraction < 1:
        raise ValueError(f"idle_fraction={idle_fraction!r}: must lie in (0, 1)")
    horizon = hours * 3600.0
    mean_frag_h = math.exp(mu_ln_min + sigma**2 / 2) / 60.0 + 0.5 / leaves_per_hour
    batch_mean = max(1.0, idle_fraction * nodes / (joins_per_hour * mean_frag_h))
    names = [f"node{i:04d}" for i in range(nodes)]
    busy = list(range(nodes))  # indices of busy nodes; picked uniformly without replacement
    n_leaves = rng.poisson(leaves_per_hour * hours)
    leave_times = np.sort(rng.uniform(0.0, horizon, size=n_leaves))
    n_joins = rng.poisson(joins_per_hour * hours)
    join_times = np.sort(rng.uniform(0.0, horizon, size=n_joins))
    due: list[tuple[float, int]] = []  # (drawn end of fragment, node index)
    changes: list[NodeChange] = []
    li = 0
    for t_join in join_times:
        # leave events before this join release every node whose fragment has ended
        while li < len(leave_times) and leave_times[li] <= t_join:
            t_leave = float(leave_times[li])
            while due and due[0][0] <= t_leave:
                _, idx = heapq.heappop(due)
                changes.append(NodeChange(t_leave, names[idx], False))
                busy.append(idx)
            li += 1
        k = min(len(busy), int(rng.geometric(1.0 / batch_mean)))
        for _ in range(k):
            idx = busy.pop(int(rng.integers(len(busy))))
            length = float(rng.lognormal(mu_ln_min, sigma)) * 60.0
            changes.append(NodeChange(float(t_join), names[idx], True))
            heapq.heappush(due, (float(t_join) + length, idx))
    while li < len(leave_times):
        t_leave = float(leave_times[li])
        while due and due[0][0] <= t_leave:
            _, idx = heapq.heappop(due)
            changes.append(NodeChange(t_leave, names[idx], False))
        li += 1
    return IdleTrace(tuple(changes))


@dataclass(frozen=True, slots=True)
class TraceStats:
    hours: float
    join_events_per_hour: float
    leave_events_per_hour: float
    mean_idle_nodes: float
    fragments: int
    frac_fragments_under_10min: float
    node_time_share_under_10min: float
    median_fragment_min: float


def trace_stats(trace: IdleTrace, end: float | None = None) -> TraceStats:
    """The paper's Sec. 2.1 statistics, measured on a trace (fragments still open at ``end`` are cut there)."""
    end = trace.end_time if end is None else end
    since: dict[str, float] = {}
    lengths: list[float] = []
    joins = leaves = 0
    for _, cs in trace.events():
        joins += any(c.idle for c in cs)
        leaves += any(not c.idle for c in cs)
        for c in cs:
            if c.idle:
                since[c.node] = c.time
            else:
                lengths.append(c.time - since.pop(c.node))
    lengths += [end - t for t in since.values()]
    arr = np.array(lengths) / 60.0 if lengths else np.zeros(1)
    hours = max(end, 1e-9) / 3600.0
    short = arr < 10.0
    return TraceStats(
        hours=hours,
        join_events_per_hour=joins / hours,
        leave_events_per_hour=leaves / hours,
        mean_idle_nodes=float(arr.sum() * 60.0 / max(end, 1e-9)),
        fragments=len(lengths),
        frac_fragments_under_10min=float(short.mean()),
        node_time_share_under_10min=float(arr[short].sum() / max(arr.sum(), 1e-12)),
        median_fragment_min=float(np.median(arr)),
    )


def idle_integral(trace: IdleTrace, start: float, end: float) -> float:
    """Node-seconds of idle nodes in [start, end] — R of Eqn. 17, in seconds."""
    area, count, last = 0.0, 0, start
    for t, cs in trace.events():
        if t > end:
            break
        if t > start:
            area += count * (t - last)
            last = t
        count += sum(1 if c.idle else -1 for c in cs)
    return area + count * max(0.0, end - last)


def fragments_by_node(changes: Iterable[NodeChange]) -> dict[str, list[tuple[float, float]]]:
    """(start, end) idle periods per node; helper for checks and plots."""
    out: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for c in changes:
        if c.idle:
            since[c.node] = c.time
        else:
            out.setdefault(c.node, []).append((since.pop(c.node), c.time))
    return out


def first_nodes(trace: IdleTrace, count: int) -> Sequence[str]:
    """The first ``count`` distinct node names in trace order (for small demos)."""
    seen: dict[str, None] = {}
    for c in trace.changes:
        seen.setdefault(c.node, None)
        if len(seen) >= count:
            break
    return tuple(seen)
