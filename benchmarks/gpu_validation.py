"""What one (or more) GPU allows, ready for when a GPU machine is lent; on CPU it says what it skipped.

Checks, each on its own so a failure or a skip does not hide the others:

  device_assignment   the CUDA_VISIBLE_DEVICES each local GPU worker is started with; on a GPU
                      host the cluster is started and every worker reports the device it
                      really sees (distinct UUIDs = one GPU per rank)
  state_round_trip    an Adam/AdamW job's state on the GPU: checkpoint save/load keeps every
                      tensor bit for bit and on its device (exp_avg on cuda, step on the CPU);
                      save and load milliseconds for resnet_10m
  state_broadcast     2 processes, one GPU each, a cpu:gloo,cuda:nccl group: the joiner's
                      Adam state equals the survivor's (needs 2 GPUs)
  profile_amp         resnet_10m / vgg_10m / tiny_lm iteration time at GPU batch sizes, fp32
                      against bf16 autocast (and fp16) side by side: ms and the speed-up ratio
  elastic_in_place    the product (the rank loop of `malleable train`, benchmarks/gpu_product.py)
                      for each of --models (tiny_lm, resnet_small) on nccl: 1->2->1 in place
                      (2->4->2 with 4 GPUs), the pause of each change and the peak memory
  killed_rank         the same, one rank SIGKILLed mid-run: finished with the exact sample
                      count, the recovery's pause and the steps lost
  probe_overhead      the gradient-noise probe's cost per step (skipped: it cannot be switched
                      off on the product path yet, so there is no side-by-side to measure)

On CPU (no GPU lent) elastic_in_place and killed_rank still run the product, on gloo with
virtual GPUs, as a smoke of the path; what only a GPU shows (nccl, CUDA memory, AMP) is
listed under skipped / skipped_parts.

Figures (last line, JSON): cuda (bool), gpus, skipped {check: reason}, and per check its
figures (<model>_<precision>_ms_b<b>, <model>_bf16_speedup_b<b>, ckpt_save_ms, ckpt_load_ms,
workers_distinct_devices, ...).

Run: python benchmarks/gpu_validation.py [--batches 64,128,256] [--repeats 10] [--only a,b]
     [--models elastic_tasks.examples:tiny_lm,elastic_tasks.examples:resnet_small] [--steps 30] [--batch 32]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable

import torch

SkipReason = str


class Skip(Exception):
    pass


def _need_gpus(n: int) -> None:
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < n:
        raise Skip(f"needs {n} CUDA device(s), this machine has {have}")


def device_assignment(args: argparse.Namespace) -> dict[str, object]:
    from deploy.local import local_gpu_cluster, visible_cuda_devices
    from elastic_tasks.devices import cuda_worker_env

    virtual = cuda_worker_env(["0", "1", "2", "3"])
    out: dict[str, object] = {"rotation_4_gpus": [e["CUDA_VISIBLE_DEVICES"] for e in virtual]}
    visible = visible_cuda_devices()
    if not visible:
        out["skipped_part"] = "no CUDA: the rotation is computed, no GPU worker started"
        return out
    from distributed import Client

    def seen() -> str:
        return f"{os.environ.get('CUDA_VISIBLE_DEVICES')}|{torch.cuda.get_device_properties(0).uuid}"

    with local_gpu_cluster(len(visible)) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(visible), timeout=120)
        views = client.run(seen)
    out["workers"] = len(views)
    out["workers_distinct_devices"] = len({v.split("|")[1] for v in views.values()})
    return out


def _adam_state(device: torch.device, name: str = "resnet_10m"):
    from elastic_tasks.examples import EXAMPLES
    from elastic_tasks.rank.scaling import LRRamp
    from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta

    torch.manual_seed(0)
    recipe = EXAMPLES[name]()
    model = recipe.build_model().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 3, 16, 16, device=device)
    for _ in range(2):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    meta = TrainMeta(step=2, samples_seen=16, global_batch=8, lr=LRRamp(1e-3, 1e-3), rng_state=b"")
    return ElasticState(model, opt, meta, torch.amp.GradScaler(device.type))


def state_round_trip(args: argparse.Namespace) -> dict[str, object]:
    _need_gpus(1)
    from elastic_tasks.rank.state.elastic import buckets

    device = torch.device("cuda", 0)
    src, dst = _adam_state(device), _adam_state(device)
    for p in dst.model.parameters():
        p.data.add_(1.0)  # make them differ before the load
    with tempfile.TemporaryDirectory() as d:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        src.save(d)
        t1 = time.perf_counter()
        dst.load(d)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    equal = all(torch.equal(a, b) for a, b in zip(src._tensors(), dst._tensors()))
    devices = sorted({str(t.device) for t in dst._tensors()})
    return {
        "ckpt_save_ms": round((t1 - t0) * 1e3, 1),
        "ckpt_load_ms": round((t2 - t1) * 1e3, 1),
        "ckpt_exact": equal,
        "state_devices": devices,
        "broadcast_buckets": [f"{b[0].device}/{b[0].dtype}" for b in buckets(src._tensors())],
    }


def state_broadcast(args: argparse.Namespace) -> dict[str, object]:
    _need_gpus(2)
    import subprocess
    import sys

    # The test does exactly this; run it here so its verdict lands in the figures.
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/test_state_broadcast.py", "-k", "cpu_gloo_cuda_nccl"],
        capture_output=True, text=True, timeout=300,
    )
    return {"passed": out.returncode == 0, "tail": out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-200:]}


def profile_amp(args: argparse.Namespace) -> dict[str, object]:
    _need_gpus(1)
    from allocator.types import AllreduceModel
    from elastic_tasks.examples import EXAMPLES, tiny_lm
    from elastic_tasks.profiling.settings import ProfileSettings
    from elastic_tasks.profiling.profiler import profile_recipe

    no_comm = AllreduceModel(latency_s=1e-4, seconds_per_param=1e-9)
    settings = ProfileSettings(batch_sizes=args.batches, warmup=3, repeats=args.repeats, device="cuda:0", max_batch_per_gpu=max(args.batches))
    out: dict[str, object] = {}
    recipes = {"resnet_10m": EXAMPLES["resnet_10m"], "vgg_10m": EXAMPLES["vgg_10m"], "tiny_lm": tiny_lm}
    for name, build in recipes.items():
        base = build()
        times = {}
        for precision in ("fp32", "bf16", "fp16"):
            report = profile_recipe(dataclasses.replace(base, precision=precision), settings, allreduce=no_comm)
            times[precision] = dict(zip(report.profile.batch_sizes, report.raw_iter_times_s))
            for b, t in times[precision].items():
                out[f"{name}_{precision}_ms_b{b}"] = round(t * 1e3, 2)
        for b in times["fp32"]:
            if b in times["bf16"]:
                out[f"{name}_bf16_speedup_b{b}"] = round(times["fp32"][b] / times["bf16"][b], 2)
    return out


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _product_run(args: argparse.Namespace, entry: str):  # noqa: ANN202
    from gpu_product import Run

    return Run(entry, args.steps, args.batch, "nccl" if _gpus() else "gloo")


def elastic_in_place(args: argparse.Namespace) -> dict[str, object]:
    from gpu_product import elastic_in_place as run

    gpus = _gpus()
    if gpus == 1:
        raise Skip("an in-place grow needs 2 CUDA devices, this machine has 1")
    out: dict[str, object] = {} if gpus else {"skipped_parts": "no CUDA: gloo on virtual GPUs; peak memory is the process RSS, not CUDA's"}
    for entry in args.models:
        out[entry.rsplit(":", 1)[-1]] = run(_product_run(args, entry), gpus or 2)
    return out


def killed_rank(args: argparse.Namespace) -> dict[str, object]:
    from gpu_product import killed_rank as run

    gpus = _gpus()
    if gpus == 1:
        raise Skip("surviving a killed rank needs 2 CUDA devices, this machine has 1")
    out: dict[str, object] = {} if gpus else {"skipped_parts": "no CUDA: gloo on 3 virtual GPUs (gloo raises where nccl hangs; tests/test_nccl_hang_system.py simulates the hang)"}
    for entry in args.models:
        out[entry.rsplit(":", 1)[-1]] = run(_product_run(args, entry), min(3, gpus) if gpus else 3)
    return out


def probe_overhead(args: argparse.Namespace) -> dict[str, object]:
    raise Skip("the noise probe cannot be switched off on the product path in this branch: no side-by-side to time")


CHECKS: dict[str, Callable[[argparse.Namespace], dict[str, object]]] = {
    "device_assignment": device_assignment,
    "state_round_trip": state_round_trip,
    "state_broadcast": state_broadcast,
    "profile_amp": profile_amp,
    "elastic_in_place": elastic_in_place,
    "killed_rank": killed_rank,
    "probe_overhead": probe_overhead,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,128,256")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--only", default=",".join(CHECKS), help="checks to run, comma-separated")
    parser.add_argument("--models", default="elastic_tasks.examples:tiny_lm,elastic_tasks.examples:resnet_small")
    parser.add_argument("--steps", type=int, default=30, help="steps of each product run")
    parser.add_argument("--batch", type=int, default=32, help="global batch of each product run")
    args = parser.parse_args()
    args.batches = tuple(int(b) for b in args.batches.split(","))
    args.models = [m for m in args.models.split(",") if m]
    only = [c for c in args.only.split(",") if c]
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        parser.exit(2, f"--only={args.only!r}: unknown check {unknown[0]!r} (known: {', '.join(CHECKS)})\n")
    cuda = torch.cuda.is_available()
    figures: dict[str, object] = {"cuda": cuda, "gpus": torch.cuda.device_count() if cuda else 0, "torch": torch.__version__}
    skipped: dict[str, SkipReason] = {}
    for name, check in CHECKS.items():
        if name not in only:
            continue
        t0 = time.perf_counter()
        try:
            result = check(args)
        except Skip as reason:
            skipped[name] = str(reason)
            print(f"SKIPPED {name}: {reason}")
            continue
        except Exception as exc:  # noqa: BLE001 - report and go on with the other checks
            figures[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"FAILED  {name}: {type(exc).__name__}: {exc}")
            continue
        figures[name] = result
        print(f"ran     {name} in {time.perf_counter() - t0:.1f} s: {result}")
    figures["skipped"] = skipped
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
