"""The elastic trainer's step against a plain DDP loop's, counted per steady step (issue 34).

One process per rank (gloo; 2 ranks: spawned processes), each building side by side, on the
same recipe, (a) the trainer's own rank (``elastic_tasks.rank.trainer._Rank``: its loader,
agreement, hook, noise probe, records, wall regions; the job board and the Dask worker are
stand-ins that never answer, as on a steady step none is asked) driven by its loop's own
step (``_Rank._one_step``), and (b) a plain DDP loop as a tuned user writes it: DataLoader,
``loss_fn(ddp(x), y)``, backward, ``optimizer.step()``, the loss read every ``LOG_EVERY``
steps only. Per steady step, after ``--warmup`` steps, elastic minus plain
(``step_counters.py`` says what each count means and how a GPU's host syncs are emulated):

  python_calls, torch_ops, kernel_ops, collectives, collective_bytes, host_syncs,
  lagged_reads, grad_passes, retained_bytes (per step, after warm-up),
  cpu_median_ms / cpu_iqr_ms: the per-round difference of process CPU time (one elastic and
  one plain step per round, order alternating), median and interquartile range.

at 1 and 2 ranks, the noise probe off and on. Keys: ``r<ranks>_<off|on>_<count>`` (the
elastic minus plain difference) and ``..._elastic`` / ``..._plain`` for the counts themselves.

Usage: ``PYTHONPATH=. python benchmarks/step_work_bench.py [--model mlp_tiny] [--rounds 1000]``;
the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_counters  # noqa: E402

LOG_EVERY = 50  # a tuned plain loop reads its loss this often
COUNTS = ("torch_ops", "kernel_ops", "collectives", "collective_bytes", "host_syncs", "lagged_reads")


class _Board:
    """The job board as a steady step sees it: no plan to come, nobody lost, events dropped."""

    def aborted_generation(self) -> int:
        return -1

    def post(self, event: object) -> None:
        pass

    def set_status(self, status: object) -> None:
        pass

    def confirm_writer(self) -> None:  # never fenced: a steady step's checkpoint commits
        pass


class _Groups:
    """The generation's group: the one this process formed already (no board rendezvous)."""

    store = None  # no generation store: plans (none come) would be read from the board

    def form(self, *args: object) -> None:
        pass

    @staticmethod
    def drop(aborted: bool = False) -> None:
        pass


def elastic(entry: str, batch: int, world: int, rank: int, probe: bool):  # noqa: ANN201 - (step, model, ddp)
    from elastic_tasks.protocol import Plan, PlanKind, RankSpec, TrainConfig
    from elastic_tasks.rank import trainer

    trainer.get_worker = lambda: SimpleNamespace(address="tcp://127.0.0.1:0")  # the rank asks its worker's host only
    config = TrainConfig(global_batch=batch, max_steps=10**9, backend="gloo", evaluate=False, noise_probe=probe, torch_threads=1)
    uids = tuple(f"r{i}" for i in range(world))
    spec = RankSpec("bench", uids[rank], entry, config, 0)
    r = trainer._Rank(spec, _Board())  # type: ignore[arg-type]
    r.groups = _Groups()  # type: ignore[assignment]
    r._enter(Plan(0, PlanKind.START, uids, batch), time.time())
    return r._one_step, r.state.model, r.ddp


def plain(entry: str, batch: int, world: int, rank: int):  # noqa: ANN201 - (step, model, ddp)
    from elastic_tasks.recipe import build_optimizer, collate_function, load_entry_point

    recipe = load_entry_point(entry)
    torch.manual_seed(0)
    model = recipe.build_model()
    ddp = DistributedDataParallel(model)
    optimizer = build_optimizer(recipe, model)
    opts = recipe.loader
    g = torch.Generator().manual_seed(rank)
    data = DataLoader(
        recipe.dataset, batch_size=batch // world, shuffle=True, drop_last=True, collate_fn=collate_function(recipe),
        num_workers=opts.num_workers, persistent_workers=opts.num_workers > 0, generator=g,
    )
    batches = itertools.chain.from_iterable(itertools.repeat(data))
    counter = itertools.count()

    def step() -> None:
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = recipe.loss_fn(ddp(x), y)  # type: ignore[misc]
        loss.backward()
        optimizer.step()
        if next(counter) % LOG_EVERY == 0:
            float(loss.detach())

    return step, model, ddp


def _grad_numels(model: torch.nn.Module, ddp: DistributedDataParallel) -> set[int]:
    numels = {p.numel() for p in model.parameters()}
    numels.add(sum(p.numel() for p in model.parameters()))  # a single bucket (small models)
    return numels


def measure(entry: str, batch: int, world: int, rank: int, probe: bool, args: argparse.Namespace) -> dict[str, float]:
    loops = {"elastic": elastic(entry, batch, world, rank, probe), "plain": plain(entry, batch, world, rank)}
    n_params = sum(p.numel() for p in loops["plain"][1].parameters())
    out: dict[str, float] = {}
    for name, (step, model, ddp) in loops.items():
        for _ in range(args.warmup):
            step()
        counts = step_counters.count_ops(step, args.steps, [*model.parameters()], _grad_numels(model, ddp))
        for key in COUNTS:
            out[f"{key}_{name}"] = getattr(counts, key) / args.steps
        out[f"grad_passes_{name}"] = counts.grad_elements / n_params / args.steps
        if args.explain:
            print(f"{name}: kernel-like ops per step", {k: v / args.steps for k, v in sorted(counts.kernels.items())}, file=sys.stderr)
        out[f"python_calls_{name}"] = step_counters.count_python_calls(step, args.steps) / args.steps
        out[f"retained_bytes_{name}"] = step_counters.retained_bytes(step, args.retain_steps)
    deltas = []
    for r in range(args.rounds):
        took = {}
        for name in ("elastic", "plain") if r % 2 == 0 else ("plain", "elastic"):
            c0 = time.process_time()
            loops[name][0]()
            took[name] = time.process_time() - c0
        deltas.append(1e3 * (took["elastic"] - took["plain"]))
    q = statistics.quantiles(deltas, n=4)
    out["cpu_median_ms"] = statistics.median(deltas)
    out["cpu_iqr_ms"] = [q[0], q[2]]  # type: ignore[assignment]
    for key in (*COUNTS, "grad_passes", "python_calls", "retained_bytes"):
        out[key] = out[f"{key}_elastic"] - out[f"{key}_plain"]
    return out


def _worker(rank: int, world: int, init: str, result: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        figures = {probe: measure(args.model, args.batch, world, rank, probe, args) for probe in (False, True)}
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(result).write_text(json.dumps({"off" if not p else "on": f for p, f in figures.items()}))


def run(world: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        init, result = f"file://{tmp}/rdzv", os.path.join(tmp, "result.json")
        if world == 1:
            _worker(0, 1, init, result, args)
        else:
            mp.spawn(_worker, args=(world, init, result, args), nprocs=world, join=True)
        return json.loads(Path(result).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp_tiny", help="an example recipe name or module:function")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=50, help="steady steps counted")
    parser.add_argument("--retain-steps", type=int, default=640, help="steps over which retained memory is measured (whole epochs: mlp_tiny at batch 32 has 64 steps each, so per-epoch caches cancel)")
    parser.add_argument("--rounds", type=int, default=1000, help="interleaved timing rounds")
    parser.add_argument("--explain", action="store_true", help="print each loop's kernel-like ops by name (stderr)")
    args = parser.parse_args()
    for name, value in (("batch", args.batch), ("warmup", args.warmup), ("steps", args.steps), ("retain-steps", args.retain_steps), ("rounds", args.rounds)):
        if value < 1:
            print(f"--{name}={value}: must be >= 1", file=sys.stderr)
            raise SystemExit(2)
    if ":" not in args.model:
        args.model = f"elastic_tasks.examples.recipes:{args.model}"
    from elastic_tasks.recipe import load_entry_point

    try:
        load_entry_point(args.model)
    except Exception as exc:  # noqa: BLE001 - bad input: one line, exit 2
        print(f"--model={args.model!r}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        worlds = [int(w) for w in args.ranks.split(",")]
        if min(worlds) < 1:
            raise ValueError("each must be >= 1")
    except ValueError as exc:
        print(f"--ranks={args.ranks!r}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    t0 = time.time()
    figures: dict[str, object] = {"model": args.model.rsplit(":", 1)[-1], "batch": args.batch, "log_every": LOG_EVERY, "steps": args.steps, "rounds": args.rounds}
    for world in worlds:
        for probe, f in run(world, args).items():
            for key, value in f.items():
                figures[f"r{world}_{probe}_{key}"] = [round(v, 4) for v in value] if isinstance(value, list) else round(value, 4)
            print(f"ranks {world} probe {probe}: " + ", ".join(f"{k} {f[k]:+.3f}" for k in ("python_calls", "kernel_ops", "collectives", "host_syncs", "grad_passes", "retained_bytes", "cpu_median_ms")))
    figures["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
