"""What a GPU machine says about the product, in one run with a verdict; on CPU, what it can.

``python benchmarks/gpu_validation.py`` (no arguments) runs every check this machine allows,
each in its own process with its own time limit (a hung nccl collective ends its check, not
the run), within an overall budget (8 minutes on one H100 by default), and prints one line per
check and, last, one JSON object: ``{"verdict": "pass"|"fail", "checks": {name: {"status",
"seconds", "figures", "criteria", ...}}, "skipped": {name: reason}, ...}``. A check passes when
each of its criteria holds (each criterion: value, limit, ok); the verdict is "pass" when at
least one check ran and none failed. The checks (``gpu_checks.CHECKS``; ``--dry-run`` lists
them with what each needs and what it would do here):

  environment        torch, CUDA, nccl; the nccl error mode a rank sets (0: torch's for aborts)
  elastic_vs_ddp     one GPU: the product's rank loop on nccl (world 1) beside plain DDP on the
                     same worker, CUDA-event step times, interleaved rounds; pass: elastic within
                     2 % of plain (mean step time), every run finished with exact samples
  amp                the same in bf16 and fp16 (GradScaler): finished, finite losses, ratios
  restart_rescale    the rank's process restarted mid-run (checkpoint-restart): the pause, and
                     the peak CUDA memory after the restart within 25 % of before
  probe_overhead     the product with the gradient-noise probe on against off
  state_round_trip   an AdamW state saved and loaded on the GPU, bit for bit
  device_assignment  one GPU per Dask worker (distinct device UUIDs)
  profile_amp        the profiler's fp32/bf16/fp16 iteration times
  state_broadcast, elastic_in_place, killed_rank   two GPUs or more: the nccl state broadcast,
                     in-place grow and shrink, a SIGKILLed rank

Without CUDA the checks that run the product do so on gloo with small sizes (a smoke: their
timing criteria are listed under ``skipped_parts``); the others are skipped, saying why. The
exit code is 0 whatever the verdict (2 for bad arguments).

Needs, beside torch: the repository (put on the path here) and Dask (``distributed``). On a
machine without Dask and without network (the lent GPU machines), carry wheels in ``.whl/``
at the repository's root, made where pip works by ``benchmarks/gpu_wheels.sh``: they are
installed into a temporary directory at start.

Run: python benchmarks/gpu_validation.py [--dry-run] [--only a,b] [--budget SECONDS]
     [--timeout SECONDS | --timeout name=SECONDS,...] [--rounds 3] [--step-batch 256] ...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if "--child" in sys.argv:
    import faulthandler

    # A check that runs out of time is asked for its threads' stacks before it is killed (_run_child),
    # from its first instant: one still importing Dask or torch (seconds on a loaded box) would
    # otherwise die of the signal with nothing said (seen: an empty output tail under load).
    faulthandler.register(signal.SIGUSR1, all_threads=True)

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _p in (str(BENCH), str(REPO)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

RESULT = "GPU_VALIDATION_RESULT "  # a child's last line: its check's outcome as JSON
MIN_LEFT_S = 20.0  # a check is not started with less of the budget left


def _wheels(wheel_dir: Path) -> str | None:
    """Install carried wheels (no index, no network) if Dask is missing; the directory added."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        wheels = sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
        if not wheels:
            return None
        target = Path(tempfile.gettempdir()) / "malleable-gpu-site"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade", "--target", str(target), *map(str, wheels)], check=True)
        sys.path.insert(0, str(target))
        return str(target)
    return None


def _parse(argv: list[str]) -> argparse.Namespace:
    from gpu_checks import CHECKS

    names = [c.name for c in CHECKS]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="list the checks, what each needs and would do here; run nothing")
    p.add_argument("--only", default=",".join(names), help="checks to run, comma-separated")
    p.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 470 with CUDA: 8 minutes on one H100 with the start; 1800 without, where the smokes run on a CPU); checks that would start later are skipped")
    p.add_argument("--timeout", default="", help="seconds per check (all), or name=seconds,... (those)")
    p.add_argument("--rounds", type=int, default=4, help="elastic_vs_ddp: interleaved rounds (even: each order as often)")
    p.add_argument("--amp-rounds", type=int, default=2, help="amp, probe_overhead: rounds")
    p.add_argument("--step-batch", type=int, default=256, help="batch of the timed runs (GPU)")
    p.add_argument("--warmup", type=int, default=30, help="steps of a timed run left out (GPU)")
    p.add_argument("--timed-steps", type=int, default=150, help="steps of a timed run measured (GPU)")
    p.add_argument("--batches", default="128,256", help="profile_amp: batch sizes")
    p.add_argument("--repeats", type=int, default=5, help="profile_amp: timed iterations")
    p.add_argument("--models", default="elastic_tasks.examples:tiny_lm,elastic_tasks.examples:resnet_small", help="elastic_in_place, killed_rank")
    p.add_argument("--steps", type=int, default=30, help="elastic_in_place, killed_rank: steps")
    p.add_argument("--batch", type=int, default=32, help="elastic_in_place, killed_rank: global batch")
    p.add_argument("--wheels", default=str(REPO / ".whl"), help="wheels to install if Dask is missing")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.only_list = [c for c in args.only.split(",") if c]
    unknown = [c for c in args.only_list + ([args.child] if args.child else []) if c not in names]
    if unknown:
        p.exit(2, f"--only={args.only!r}: unknown check {unknown[0]!r} (known: {', '.join(names)})\n")
    try:
        args.batches = tuple(int(b) for b in args.batches.split(","))
        args.timeouts = _timeouts(args.timeout, names)
    except ValueError as exc:
        p.exit(2, f"{exc}\n")
    args.models = [m for m in args.models.split(",") if m]
    return args


def _timeouts(spec: str, names: list[str]) -> dict[str, float]:
    if not spec:
        return {}
    if "=" not in spec:
        return dict.fromkeys(names, float(spec))
    out = {}
    for part in spec.split(","):
        name, _, value = part.partition("=")
        if name not in names:
            raise ValueError(f"--timeout={spec!r}: unknown check {name!r}")
        out[name] = float(value)
    return out


def _dask(args: argparse.Namespace) -> str:
    try:
        import distributed
    except ImportError:
        return f"missing ({'wheels in ' + args.wheels if Path(args.wheels).is_dir() else 'no wheels: benchmarks/gpu_wheels.sh'})"
    return distributed.__version__


def _here(check, have: int) -> tuple[str, str]:  # noqa: ANN001 - a gpu_checks.Check
    """What ``check`` would do on this machine: (runs | smoke | partial | skipped, why)."""
    if have >= check.gpus:
        return "runs", ""
    if check.without == "skip" or (have and check.without == "smoke"):
        return "skipped", f"needs {check.gpus} CUDA device(s), this machine has {have}"
    return check.without, f"this machine has {have} of its {check.gpus} CUDA device(s): {'the product on gloo, small sizes' if check.without == 'smoke' else 'what needs no GPU'}"


def _child(args: argparse.Namespace) -> None:
    """Run one check in this process (SIGUSR1 prints its stacks: see the top); its outcome is the last line."""
    from gpu_checks import CHECKS, Skip

    check = next(c for c in CHECKS if c.name == args.child)
    try:
        out = check.run(args)
    except Skip as reason:
        out = {"skip": str(reason)}
    except Exception as exc:  # noqa: BLE001 - the check failed: say how, in one line
        out = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:400]}
    print(RESULT + json.dumps(out, default=str), flush=True)


def _session(sid: int) -> list[int]:
    import psutil  # Dask's dependency: the checks need Dask anyway

    pids = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid:
                pids.append(pid)
        except (ProcessLookupError, PermissionError):
            pass  # gone since the listing, or not ours
    return pids


def _end_session(sid: int, grace_s: float) -> int:
    """SIGKILL what is left of the session ``sid`` (a check: it and all it started) after up to
    ``grace_s`` for it to end by itself (a fork server exits once its caller has); how many."""
    deadline = time.monotonic() + grace_s
    while (left := _session(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


def _run_child(argv: list[str], name: str, timeout_s: float, env: dict[str, str]) -> dict[str, object]:
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", name]
    # Output to a file, not a pipe, and the check's session ended after it: a Dask worker leads a
    # process group of its own (deploy/forkserver.py), so a worker its check left behind outlived a
    # killpg of the check's group and, holding the pipe open, kept the run waiting for ever.
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGUSR1)  # the check's stacks into its log (_child), then the kill
            time.sleep(1.0)
        left = _end_session(proc.pid, 0 if timed_out else 2.0) - (1 if timed_out else 0)  # less the check itself, if it ran on
        proc.wait()
        log.seek(0)
        out = log.read()
    if timed_out:
        return {"error": f"timed out after {timeout_s:g} s", "output_tail": out[-8000:]}
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT)]
    if not lines:
        tail = " | ".join(out.strip().splitlines()[-3:])
        return {"error": f"exit code {proc.returncode}, no result: {tail[-400:]}"}
    result = json.loads(lines[-1][len(RESULT):])
    if left > 0:  # a check's processes outlived it: said, not failed (the check's own criteria decide)
        result["processes_left_behind"] = left
    return result


def _derived(checks: dict[str, object]) -> dict[str, object]:
    """Figures across checks: the product's own bf16 speed-up (fp32 and bf16 runs of the same model)."""
    try:
        fp32 = checks["elastic_vs_ddp"]["figures"]["elastic_mean_ms"]  # type: ignore[index]
        bf16 = checks["amp"]["figures"]["bf16"]["elastic_mean_ms"]  # type: ignore[index]
    except (KeyError, TypeError):
        return {}
    return {"product_bf16_speedup": round(fp32 / bf16, 3)}


def main(argv: list[str]) -> None:
    args = _parse(argv)
    site = _wheels(Path(args.wheels)) if not args.dry_run else None
    if args.child:
        _child(args)
        return
    import torch

    from gpu_checks import CHECKS, gpus

    have = gpus()
    header = {"cuda": torch.cuda.is_available(), "gpus": have, "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if have else "cpu", "dask": _dask(args)}
    chosen = [c for c in CHECKS if c.name in args.only_list]
    if args.budget is None:
        args.budget = 470.0 if have else 1800.0
    if args.dry_run:
        listing = {}
        for c in chosen:
            what, why = _here(c, have)
            timeout = args.timeouts.get(c.name, c.timeout_s)
            listing[c.name] = {"needs": c.needs, "gpus": c.gpus, "here": what, "why": why, "timeout_s": timeout}
            print(f"{c.name:18} {what:8} {timeout:5.0f} s  needs {c.needs}" + (f"  [{why}]" if why else ""))
        print(json.dumps({"dry_run": True, **header, "budget_s": args.budget, "checks": listing}))
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (site, str(BENCH), str(REPO), os.environ.get("PYTHONPATH")) if p)}
    passthrough = [a for a in argv if a != "--dry-run"]
    t0 = time.monotonic()
    checks: dict[str, object] = {}
    skipped: dict[str, str] = {}
    for c in chosen:
        what, why = _here(c, have)
        left = args.budget - (time.monotonic() - t0)
        if what == "skipped" or left < MIN_LEFT_S:
            skipped[c.name] = why if what == "skipped" else f"over the run's budget ({args.budget:g} s)"
            print(f"SKIP {c.name}: {skipped[c.name]}", flush=True)
            continue
        started = time.monotonic()
        limit = args.timeouts.get(c.name, c.timeout_s)
        out = _run_child(passthrough, c.name, min(limit, left), env)
        if left < limit and str(out.get("error", "")).startswith("timed out"):
            out["error"] = f"{out['error']}: the end of the run's budget ({args.budget:g} s), short of its own limit ({limit:g} s)"
        seconds = round(time.monotonic() - started, 1)
        if "skip" in out:
            skipped[c.name] = str(out["skip"])
            print(f"SKIP {c.name}: {out['skip']}", flush=True)
            continue
        criteria = out.get("criteria", {})
        failed = [k for k, v in criteria.items() if not v["ok"]]  # type: ignore[union-attr, index]
        status = "fail" if "error" in out or failed else "pass"
        checks[c.name] = {"status": status, "seconds": seconds, **out}
        detail = out.get("error") or (f"failed: {', '.join(failed)}" if failed else f"{len(criteria)} criteria hold")  # type: ignore[arg-type]
        print(f"{status.upper()} {c.name} ({seconds:g} s): {detail}" + (f"; not here: {out['skipped_parts']}" if out.get("skipped_parts") else ""), flush=True)
        if out.get("output_tail"):  # a timed-out check: the end of its output, its stacks included
            print(f"--- the end of {c.name}'s output ---\n{out['output_tail']}\n--- end ---", flush=True)
    derived = _derived(checks)
    ran = [v["status"] for v in checks.values()]  # type: ignore[index]
    verdict = "pass" if ran and "fail" not in ran else "fail"
    summary = {"verdict": verdict, **header, "checks": checks, "skipped": skipped, **derived, "wall_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
