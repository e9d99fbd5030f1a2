"""Pollux's OSDI'21 artifact (``simulator/``) converted into our jobs: profiles, work, noise scales.

What ``benchmarks/pollux_trace_bench.py`` replays (its docstring says how each is converted), and
Pollux's own published figures per workload (``results-jobload/pollux-<load>/summary.json``: each
job's JCT, so the mean, the p95 and the makespan of each workload). Nothing of the artifact is
stored in this repository. ``write_jobs_file`` writes a workload as a jobs file for
``malleable simulate``: each application's profile and noise trajectory once, named by its jobs.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from allocator.physics.noise import NoiseTrajectory, noise_from_stats, noise_to_value
from allocator.physics.topology import fit_overlapped_topology
from allocator.profiles.io import profile_to_dict
from allocator.types import JobSpec, ThroughputProfile

POLLUX_PUBLISHED_AVG_JCT_S = 2751.0
CAPACITY, GPUS_PER_NODE = 64, 4
# Pollux's simulator: applications.py (max_epochs; yolov3's memory cap) and simulator.py (ncf's pinned batch).
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}
PINNED_BATCH = {"ncf": 32768}
NOMINAL_PARAMS = 10_000_000  # the ring model's p x beta: only the product is fitted


@dataclass(frozen=True, slots=True)
class Application:
    name: str
    profile: ThroughputProfile
    init_batch: int
    max_batch: int
    min_local: int
    work_samples: int
    noise: NoiseTrajectory


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def padded_envelope(times: tuple[float, ...]) -> tuple[float, ...]:
    """The largest non-decreasing sequence at or below ``times`` (the minimum over each batch and the
    larger ones): a batch runs in at most the time measured for a larger one, padded to it.

    Why not the profile reader's running maximum (``monotone_envelope``): Pollux's simulator takes
    each traced step as the truth, and a dip there is no one-off — yolov3's 8 samples per GPU run
    faster than its 6 in 126 of the 144 placements traced at both (median 0.94x; 1 GPU 0.33 vs 0.45 s,
    2: 0.36 vs 0.46, 4 x 4: 1.19 vs 1.34). Raising the 8 to the 6's time made every one-GPU yolov3
    step 38 % slower than Pollux's at the batch it runs (8 per GPU is its cap); lowering the 6 to the
    8's time promises only what padding achieves.
    """
    out, low = [], float("inf")
    for t in reversed(times):
        low = min(low, t)
        out.append(low)
    return tuple(reversed(out))


def _profile(name: str, directory: Path) -> tuple[ThroughputProfile, int]:
    rows = _rows(directory / "placements.csv")
    single = sorted((int(r["local_bsz"]), float(r["step_time"])) for r in rows if r["placement"] == "1")
    cap = MAX_LOCAL_BSZ.get(name, max(b for b, _ in single))
    sizes = [b for b, _ in single]
    raw = [t for _, t in single]
    # The envelope over the batches a GPU can hold: padding cannot reach past the memory cap.
    kept = [b for b in sizes if b <= cap]
    times = padded_envelope(tuple(raw[: len(kept)]))
    measurements = []
    for r in rows + [dict(placement="", **s) for s in _rows(directory / "scalability.csv")]:
        if r["placement"]:
            nodes, replicas = len(r["placement"]), sum(int(c) for c in r["placement"])
        else:
            nodes, replicas = int(r["num_nodes"]), int(r["num_replicas"])
        if replicas < 2:
            continue
        # Against the one-GPU step traced at the same local batch (every multi-GPU local batch is traced
        # on one GPU too): a fast batch is fast in every placement, so its allreduce is what remains.
        compute = float(np.interp(int(r["local_bsz"]), sizes, raw))
        measurements.append((NOMINAL_PARAMS, replicas, nodes, compute, float(r["step_time"])))
    intra, inter, overlap = fit_overlapped_topology(measurements)
    profile = ThroughputProfile(
        workload=name,
        num_params=NOMINAL_PARAMS,
        batch_sizes=tuple(kept),
        iter_times_s=times,
        max_batch_per_gpu=cap,
        allreduce=intra,
        hardware="pollux-osdi21-trace",
        inter_host=inter,
        overlap=overlap,
    )
    return profile, min(sizes)


def _pgns(init_batch: int, row: dict[str, str]) -> float:
    """Pollux's PGNS from one epoch's statistics; a gradient with no signal left (|G|^2 = 0) has no noise limit."""
    sqr, var = float(row["grad_sqr"]), float(row["grad_var"])
    return noise_from_stats(init_batch, sqr, var) if sqr > 0 and var > 0 else float("inf")


def fitted_noise_scale(init_batch: int, pgns: dict[int, float]) -> float:
    """One B_noise standing for an epoch's per-batch PGNS: the best fit of Pollux's efficiency over the traced batches.

    Pollux's simulator values a step at batch B with the gradient statistics traced at B, so
    its efficiency is E_B = (P_B + B0) / (P_B + B); ours has one B_noise per epoch. The one whose
    E(B) = (P + B0) / (P + B) has the least squared log error against E_B over the traced batches
    (B0's own is 1 at any P). Efficiency only departs from 1 at batches well above B0, and there
    the large batches' PGNS rules; a median over the batches would weigh the small ones alike.
    """
    far = {b: p for b, p in pgns.items() if b > init_batch}
    finite = [p for p in far.values() if np.isfinite(p)]
    if not far or not finite:
        return float("inf")
    batches = np.array(list(far), dtype=float)
    target = np.log(np.array([(p + init_batch) / (p + b) if np.isfinite(p) else 1.0 for b, p in far.items()]))

    def error(log_p: float) -> float:
        p = np.exp(log_p)
        return float(np.sum((np.log((p + init_batch) / (p + batches)) - target) ** 2))

    # E rises with P for every B > B0, so the best P lies within the traced PGNS (inf: above them all).
    lo, hi = np.log(min(finite)), np.log(max(finite) * (4.0 if len(finite) < len(far) else 1.0))
    if hi - lo < 1e-12:
        return float(np.exp(lo))
    grid = np.linspace(lo, hi, 257)
    i = int(np.argmin([error(x) for x in grid]))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    ratio = (np.sqrt(5.0) - 1.0) / 2.0  # golden section on the bracket around the grid's best
    for _ in range(60):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        a, b = (a, d) if error(c) <= error(d) else (c, b)
    return float(np.exp((a + b) / 2.0))


def load_application(name: str, root: Path) -> Application:
    directory = root / "traces" / name
    profile, min_local = _profile(name, directory)
    validation = {int(p.stem.split("-")[-1]): _rows(p) for p in directory.glob("validation-*.csv")}
    init_batch, max_batch = min(validation), max(validation)
    epochs = MAX_EPOCHS[name]
    # Pollux's get_progress(e): the smallest progress any traced batch had made after epoch e.
    progress = [0.0] + [min(float(rows[e - 1]["progress"]) for rows in validation.values()) for e in range(1, epochs + 1)]
    total = progress[-1]
    pgns = [fitted_noise_scale(init_batch, {b: _pgns(init_batch, rows[e]) for b, rows in validation.items()}) for e in range(epochs)]
    starts = [p / total for p in progress[:-1]]
    noise = NoiseTrajectory((*starts, 1.0), tuple(pgns))
    return Application(name, profile, init_batch, max_batch, min_local, int(round(total * init_batch)), noise)


def load_workload(path: Path, apps: dict[str, Application]) -> list[JobSpec]:
    """One workload CSV of the artifact as our jobs."""
    jobs = []
    for row in _rows(path):
        app = apps[row["application"]]
        lo = hi = PINNED_BATCH[app.name] if app.name in PINNED_BATCH else None
        lo, hi = (lo, hi) if lo is not None else (app.init_batch, app.max_batch)
        jobs.append(
            JobSpec(
                id=row["name"],
                workload=app.name,
                total_samples=app.work_samples,
                min_batch=lo,
                max_batch=hi,
                max_gpus=max(1, min(CAPACITY, hi // app.min_local)),
                profile=app.profile,
                arrival_time=float(row["time"]),
                fixed_batch=min(max(int(row["batch_size"]), lo), hi),
                noise_scale=app.noise,
                base_batch=app.init_batch,
            )
        )
    return jobs


LOADS = ("0.5", "1.0", "1.5", "2.0")  # the artifact's job loads; 1.0 is the set the defaults were chosen on


def workload_path(root: Path, load: str, number: int) -> Path:
    return root / ("workloads" if load == "1.0" else f"workloads-{load}") / f"workload-{number}.csv"


@dataclass(frozen=True, slots=True)
class Published:
    """Pollux's published run of one workload: each job's JCT and arrival."""

    jct: dict[str, float]
    arrival: dict[str, float]

    @property
    def mean(self) -> float:
        return float(np.mean(list(self.jct.values())))

    @property
    def p95(self) -> float:
        return float(np.percentile(list(self.jct.values()), 95))

    @property
    def makespan(self) -> float:
        return max(self.arrival[j] + t for j, t in self.jct.items())


def published(root: Path, load: str, number: int) -> Published:
    data = json.loads((root / "results-jobload" / f"pollux-{load}" / "summary.json").read_text())["jcts"][f"workload-{number}"]
    arrival = {r["name"]: float(r["time"]) for r in _rows(workload_path(root, load, number))}
    return Published({k: float(v) for k, v in data.items()}, arrival)


def write_jobs_file(jobs: list[JobSpec], apps: dict[str, Application], path: Path, gpus: int = CAPACITY) -> None:
    """``jobs`` as a jobs file: each application's profile and noise trajectory written once, named by its jobs."""
    entries = []
    for j in jobs:
        entry = {"id": j.id, "profile": j.workload, "samples": j.total_samples, "min_batch": j.min_batch, "max_batch": j.max_batch,
                 "max_gpus": j.max_gpus, "arrival_s": j.arrival_time, "fixed_batch": j.fixed_batch, "noise_scale": j.workload,
                 "base_batch": j.base_batch}  # fmt: skip
        if j.size.value != "exact":
            entry["size"] = j.size.value
        if j.actual_samples is not None:
            entry["actual_samples"] = j.actual_samples
        entries.append(entry)
    used = sorted({j.workload for j in jobs})
    data = {
        "gpus": gpus,
        "profiles": {name: profile_to_dict(apps[name].profile) for name in used},
        "noise_scales": {name: noise_to_value(apps[name].noise) for name in used},
        "jobs": entries,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
