"""gpu_validation's checks: what each needs, runs and counts as passing.

A check returns ``{"figures": {...}, "criteria": {name: {"value", "limit", "ok"}}}`` (and
``skipped_parts`` for what it could not do here); it passes when every criterion is ok. It
raises ``Skip`` when this machine cannot run it at all. Sizes are for one H100 (batches from
/work/shared/reference/README.md: a ResNet on 32 px images at some 20 ms per fp32 step);
without CUDA the checks that can run the product do so on gloo with small sizes (a smoke).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

# torch is imported where a check runs, not here: gpu_validation reads CHECKS to parse its
# arguments, and a bad argument is answered without the seconds torch takes to import.


class Skip(Exception):
    pass


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[argparse.Namespace], dict[str, object]]
    gpus: int  # CUDA devices it needs to run in full
    without: str  # what it does with fewer: "smoke" (the product on gloo), "partial" or "skip"
    needs: str
    timeout_s: float  # its own limit (seconds, on one H100)


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def need_gpus(n: int) -> None:
    if gpus() < n:
        raise Skip(f"needs {n} CUDA device(s), this machine has {gpus()}")


def crit(value: object, ok: bool, limit: object = None) -> dict[str, object]:
    return {"value": value, "limit": limit, "ok": bool(ok)}


def _finite(x: object) -> bool:
    return isinstance(x, float) and math.isfinite(x)


def environment(args: argparse.Namespace) -> dict[str, object]:
    import torch
    import torch.distributed as dist

    from elastic_tasks.rank.health.hang_watch import NCCL_ERROR_ENV, configure_nccl_error_mode

    name = NCCL_ERROR_ENV[0]
    before = os.environ.pop(name, None)
    configure_nccl_error_mode("nccl")  # what a rank sets before its first nccl group
    mode = os.environ.pop(name, None)
    if before is not None:
        os.environ[name] = before
    figures: dict[str, object] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(), "gpus": gpus(), "nccl_error_mode_set": mode}
    try:
        import distributed

        figures["distributed"] = distributed.__version__
    except ImportError as exc:
        figures["distributed"] = f"missing: {exc}"
    criteria = {"nccl_error_mode_0": crit(mode, mode == "0", "0"), "dask_importable": crit(figures["distributed"], "missing" not in str(figures["distributed"]))}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        figures.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1), capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported())
        version = torch.cuda.nccl.version() if dist.is_nccl_available() else None
        figures["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else version
        criteria["nccl_available"] = crit(figures["nccl"], dist.is_nccl_available())
    return {"figures": figures, "criteria": criteria}


def device_assignment(args: argparse.Namespace) -> dict[str, object]:
    from deploy.local import local_gpu_cluster, visible_cuda_devices
    from elastic_tasks.devices import cuda_worker_env

    rotation = [e["CUDA_VISIBLE_DEVICES"] for e in cuda_worker_env(["0", "1", "2", "3"])]
    figures: dict[str, object] = {"rotation_4_gpus": rotation}
    criteria = {"rotation_distinct_firsts": crit(rotation, len({r.split(",")[0] for r in rotation}) == 4)}
    visible = visible_cuda_devices()
    if not visible:
        return {"figures": figures, "criteria": criteria, "skipped_parts": "no CUDA: the rotation is computed, no GPU worker started"}
    from distributed import Client

    def seen() -> str:
        import torch

        return f"{os.environ.get('CUDA_VISIBLE_DEVICES')}|{torch.cuda.get_device_properties(0).uuid}"

    with local_gpu_cluster(len(visible)) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(visible), timeout=120)
        views = client.run(seen)
    distinct = len({v.split("|")[1] for v in views.values()})
    figures.update(workers=len(views), workers_distinct_devices=distinct)
    criteria["one_gpu_per_worker"] = crit(distinct, distinct == len(visible), len(visible))
    return {"figures": figures, "criteria": criteria}


def state_round_trip(args: argparse.Namespace) -> dict[str, object]:
    need_gpus(1)
    import torch

    from elastic_tasks.examples import EXAMPLES
    from elastic_tasks.rank.scaling import LRRamp
    from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta

    device = torch.device("cuda", 0)

    def adam_state() -> ElasticState:
        torch.manual_seed(0)
        model = EXAMPLES["resnet_10m"]().build_model().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(8, 3, 16, 16, device=device)).sum().backward()
            opt.step()
        return ElasticState(model, opt, TrainMeta(2, 16, 8, LRRamp(1e-3, 1e-3), b""), torch.amp.GradScaler("cuda"))

    src, dst = adam_state(), adam_state()
    for p in dst.model.parameters():
        p.data.add_(1.0)
    with tempfile.TemporaryDirectory() as d:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        src.save(d)
        t1 = time.perf_counter()
        dst.load(d)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    exact = all(torch.equal(a, b) for a, b in zip(src._tensors(), dst._tensors()))
    devices = sorted({str(t.device) for t in dst._tensors()})
    figures = {"ckpt_save_ms": round((t1 - t0) * 1e3, 1), "ckpt_load_ms": round((t2 - t1) * 1e3, 1), "state_devices": devices}
    return {"figures": figures, "criteria": {"bit_exact": crit(exact, exact), "on_the_gpu": crit(devices, "cuda:0" in devices)}}


def _loop(args: argparse.Namespace, precision: str, **extra: object):  # noqa: ANN202
    from gpu_step_compare import Loop

    if gpus():
        return Loop(f"gpu_step_recipes:resnet_{precision}", args.step_batch, args.warmup, args.timed_steps, "nccl", **extra)  # type: ignore[arg-type]
    return Loop("gpu_step_recipes:small_cpu", 32, 3, 10, "gloo", **extra)  # type: ignore[arg-type]


def _runs_ok(out: dict[str, object], a: str, b: str) -> dict[str, dict[str, object]]:
    """Every run of both sides finished (a product job: with exactly steps x batch samples), its loss finite."""
    runs = out["runs"]  # type: ignore[index]
    checks = {}
    for key, label in (("a", a), ("b", b)):
        product = runs[key]  # type: ignore[index]
        checks[f"{label}_finished_exact"] = crit([bool(r.get("finished", True)) and bool(r.get("samples_exact", True)) for r in product], all(r.get("finished", True) and r.get("samples_exact", True) for r in product))
        checks[f"{label}_loss_finite"] = crit([r["final_loss"] for r in product], all(_finite(r["final_loss"]) for r in product))
    return checks


def _ratio_figures(out: dict[str, object], a: str, b: str) -> dict[str, object]:
    return {
        f"{a}_over_{b}": round(out["ratio"], 4), "ratio_min": round(out["ratio_min"], 4), "ratio_max": round(out["ratio_max"], 4),  # type: ignore[arg-type]
        f"{a}_mean_ms": round(out["a_mean_ms"], 3), f"{b}_mean_ms": round(out["b_mean_ms"], 3),  # type: ignore[arg-type]
        f"{a}_median_ms": round(out["a_median_ms"], 3), f"{b}_median_ms": round(out["b_median_ms"], 3),  # type: ignore[arg-type]
    }


def elastic_vs_ddp(args: argparse.Namespace) -> dict[str, object]:
    from gpu_step_compare import elastic_vs_plain

    loop = _loop(args, "fp32")
    [out] = elastic_vs_plain([loop], args.rounds if gpus() else 1)
    figures = {"entry": loop.entry, "batch": loop.batch, "timed_steps": loop.steps, "timer": "cuda_events" if gpus() else "perf_counter", **_ratio_figures(out, "elastic", "plain")}
    criteria = _runs_ok(out, "elastic", "plain")
    if not gpus():
        return {"figures": figures, "criteria": criteria, "skipped_parts": "the 2 % criterion: needs a GPU (CUDA-event step times); this is the gloo smoke"}
    criteria["elastic_within_2pct_of_plain"] = crit(figures["elastic_over_plain"], out["ratio"] <= 1.02, 1.02)  # type: ignore[operator]
    return {"figures": figures, "criteria": criteria}


def amp(args: argparse.Namespace) -> dict[str, object]:
    need_gpus(1)
    from gpu_step_compare import elastic_vs_plain

    figures: dict[str, object] = {}
    criteria: dict[str, object] = {}
    precisions = ("bf16", "fp16")
    for precision, out in zip(precisions, elastic_vs_plain([_loop(args, p) for p in precisions], args.amp_rounds)):
        figures[precision] = _ratio_figures(out, "elastic", "plain")
        criteria.update({f"{precision}_{k}": v for k, v in _runs_ok(out, "elastic", "plain").items()})
    return {"figures": figures, "criteria": criteria}


def probe_overhead(args: argparse.Namespace) -> dict[str, object]:
    from gpu_step_compare import probe_on_off

    loop = _loop(args, "fp32")
    cap = max(1, loop.batch // 2)  # two micro-batches: the probe has a small and a big batch to compare
    from dataclasses import replace

    out = probe_on_off(replace(loop, max_batch_per_gpu=cap), args.amp_rounds if gpus() else 1)
    figures = {"max_batch_per_gpu": cap, **_ratio_figures(out, "probe_on", "probe_off"), "probe_cost_pct": round((out["ratio"] - 1) * 100, 2)}  # type: ignore[operator]
    result: dict[str, object] = {"figures": figures, "criteria": _runs_ok(out, "probe_on", "probe_off")}
    if not gpus():
        result["skipped_parts"] = "the probe's cost: needs a GPU to time; this is the gloo smoke"
    return result


def restart_rescale(args: argparse.Namespace) -> dict[str, object]:
    from gpu_product import Run, restart_rescale as run

    if gpus():
        r, at = Run("gpu_step_recipes:resnet_fp32", 60, args.step_batch, "nccl"), 30
    else:
        r, at = Run("gpu_step_recipes:small_cpu", 16, 32, "gloo"), 8
    out = run(r, at)
    criteria = {
        "finished_exact": crit([out["finished"], out["samples_exact"]], bool(out["finished"] and out["samples_exact"])),
        "pause_measured": crit(out["pause_s"], out["pause_s"] is not None),
    }
    result: dict[str, object] = {"figures": out, "criteria": criteria}
    if gpus():  # a restarted rank needs no more than its own footprint again (checkpoint loaded in place)
        limit = round(1.25 * out["peak_mem_mib_before"], 1)  # type: ignore[operator]
        criteria["peak_memory_after_restart"] = crit(out["peak_mem_mib_after"], out["peak_mem_mib_after"] <= limit, limit)  # type: ignore[operator]
    else:
        result["skipped_parts"] = "peak memory is the process RSS here, not CUDA's: no memory criterion"
    return result


def profile_amp(args: argparse.Namespace) -> dict[str, object]:
    need_gpus(1)
    import dataclasses

    from allocator.types import AllreduceModel
    from elastic_tasks.examples import EXAMPLES, tiny_lm
    from elastic_tasks.profiling.profiler import profile_recipe
    from elastic_tasks.profiling.settings import ProfileSettings

    no_comm = AllreduceModel(latency_s=1e-4, seconds_per_param=1e-9)
    settings = ProfileSettings(batch_sizes=args.batches, warmup=3, repeats=args.repeats, device="cuda:0", max_batch_per_gpu=max(args.batches))
    figures: dict[str, object] = {}
    for name, build in {"resnet_10m": EXAMPLES["resnet_10m"], "tiny_lm": tiny_lm}.items():
        times = {}
        for precision in ("fp32", "bf16", "fp16"):
            report = profile_recipe(dataclasses.replace(build(), precision=precision), settings, allreduce=no_comm)
            times[precision] = dict(zip(report.profile.batch_sizes, report.raw_iter_times_s))
            figures.update({f"{name}_{precision}_ms_b{b}": round(t * 1e3, 2) for b, t in times[precision].items()})
        figures.update({f"{name}_bf16_speedup_b{b}": round(t / times["bf16"][b], 2) for b, t in times["fp32"].items() if b in times["bf16"]})
    return {"figures": figures, "criteria": {}}


def state_broadcast(args: argparse.Namespace) -> dict[str, object]:
    need_gpus(2)
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_state_broadcast.py", "-k", "cpu_gloo_cuda_nccl"], capture_output=True, text=True, timeout=300)
    tail = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-200:]
    return {"figures": {"tail": tail}, "criteria": {"test_passed": crit(out.returncode, out.returncode == 0, 0)}}


def _product(args: argparse.Namespace, entry: str):  # noqa: ANN202
    from gpu_product import Run

    return Run(entry, args.steps, args.batch, "nccl" if gpus() else "gloo")


def elastic_in_place(args: argparse.Namespace) -> dict[str, object]:
    from gpu_product import elastic_in_place as run

    if gpus() == 1:
        raise Skip("an in-place grow needs 2 CUDA devices, this machine has 1")
    figures: dict[str, object] = {}
    criteria: dict[str, object] = {}
    for entry in args.models:
        name = entry.rsplit(":", 1)[-1]
        figures[name] = out = run(_product(args, entry), gpus() or 2)
        criteria[f"{name}_samples_exact"] = crit(out["samples"], out["samples"] == args.steps * args.batch, args.steps * args.batch)
        criteria[f"{name}_pauses_measured"] = crit(out["pause_s"], len(out["pause_s"]) == 2 and None not in out["pause_s"])  # type: ignore[arg-type, operator]
    result: dict[str, object] = {"figures": figures, "criteria": criteria}
    if not gpus():
        result["skipped_parts"] = "no CUDA: gloo on virtual GPUs; peak memory is the process RSS, not CUDA's"
    return result


def killed_rank(args: argparse.Namespace) -> dict[str, object]:
    from gpu_product import killed_rank as run

    if gpus() == 1:
        raise Skip("surviving a killed rank needs 2 CUDA devices, this machine has 1")
    figures: dict[str, object] = {}
    criteria: dict[str, object] = {}
    for entry in args.models:
        name = entry.rsplit(":", 1)[-1]
        figures[name] = out = run(_product(args, entry), min(3, gpus()) if gpus() else 3)
        criteria[f"{name}_recovered_exact"] = crit(out, bool(out["finished"] and out["samples_exact"] and out["recoveries"] == 1))
    result: dict[str, object] = {"figures": figures, "criteria": criteria}
    if not gpus():
        result["skipped_parts"] = "no CUDA: gloo on 3 virtual GPUs (gloo raises where nccl hangs; tests/test_abort_system.py takes nccl's path)"
    return result


CHECKS: tuple[Check, ...] = (  # in the order they run: what matters most first, should the budget run out
    Check("environment", environment, 0, "partial", "torch; on a GPU: CUDA, nccl", 60),
    Check("elastic_vs_ddp", elastic_vs_ddp, 1, "smoke", "1 GPU, Dask: the product's rank loop on nccl (world 1) beside plain DDP, CUDA events, interleaved rounds", 240),
    Check("amp", amp, 1, "skip", "1 GPU, Dask: the same in bf16 and fp16 (GradScaler)", 240),
    Check("restart_rescale", restart_rescale, 1, "smoke", "1 GPU, Dask: a checkpoint-restart of the rank's process: pause, peak memory", 150),
    Check("probe_overhead", probe_overhead, 1, "smoke", "1 GPU, Dask: the product with the noise probe on against off (2 micro-batches)", 180),
    Check("state_round_trip", state_round_trip, 1, "skip", "1 GPU: an AdamW state saved and loaded on cuda:0", 60),
    Check("device_assignment", device_assignment, 1, "partial", "Dask; GPUs to start one worker each (CPU: the rotation only)", 90),
    Check("profile_amp", profile_amp, 1, "skip", "1 GPU: the profiler's fp32/bf16/fp16 iteration times", 120),
    Check("state_broadcast", state_broadcast, 2, "skip", "2 GPUs: a cpu:gloo,cuda:nccl state broadcast (its test)", 300),
    Check("elastic_in_place", elastic_in_place, 2, "smoke", "2 GPUs, Dask: the product grows and shrinks in place on nccl", 300),
    Check("killed_rank", killed_rank, 2, "smoke", "2 GPUs, Dask: a rank SIGKILLed mid-run, the survivors recover", 300),
)
