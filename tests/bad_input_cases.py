"""Bad inputs for every command, and how to run one: shared by tests/test_bad_inputs.py and
benchmarks/faults_bench.py.

Each case names the command line, the environment and the words its one-line error must
contain (the flag, file or field, and the value). ``make_inputs`` writes every input file the
cases use into a fresh directory; ``run_case`` runs one case in that directory with typer's
CliRunner and reports exit code, output lines, whether a traceback escaped and what was
written — the judge is ``Outcome.clean``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.hostile_cases import hostile_cases, hostile_inputs
from tests.service_bad_cases import service_cases, service_inputs

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "examples" / "quickstart" / "jobs.yaml"
HPO = REPO / "examples" / "hpo_tiny.yaml"
TRACE_HEADER = "name,submit_s,category,samples,min_batch,max_batch,max_gpus\n"
# User entry points that fail in every way a user's code can (module names are unique to this suite).
USER_MODULES = {
    "i17_syntax.py": "def f(:\n",
    "i17_import_raises.py": "raise RuntimeError('boom at import')\n",
    "i17_fns.py": "def boom():\n    raise KeyError('inside')\n\n\ndef needs(x):\n    return x\n",
}


@dataclass(frozen=True)
class BadInput:
    id: str
    args: tuple[str, ...]
    needles: tuple[str, ...]  # compared case-insensitively
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = "."  # relative to the inputs directory
    code: int = 2
    absent: tuple[str, ...] = ()  # texts the line must not hold (a password, a raw escape)


def _jobs(**change: object) -> dict:
    data = yaml.safe_load(JOBS.read_text())
    out = copy.deepcopy(data)
    for path, value in change.items():
        where, key = path.rsplit("__", 1)
        target = out
        for part in where.split("__"):
            target = target[int(part)] if part.isdigit() else target[part]
        target[key] = value
    return out


def _hpo(**change: object) -> dict:
    data = copy.deepcopy(yaml.safe_load(HPO.read_text()))
    for path, value in change.items():
        parts = path.split("__")
        target = data
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = value
    return data


def make_inputs(root: Path) -> None:
    """Every file the cases read, in ``root`` (nothing else is there)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "adir").mkdir()
    (root / "adir.json").mkdir()
    (root / "afile").write_text("x\n")
    binary = b"\xff\xfe\x00\x81binary\x00"
    for name in ("bin.yaml", "bin.csv"):
        (root / name).write_bytes(binary)
    (root / "empty.csv").write_text("")
    (root / "hdr.csv").write_text(TRACE_HEADER)
    (root / "extra.csv").write_text(TRACE_HEADER + "a,0,1,1000,8,64,4,EXTRA\n")
    (root / "good.csv").write_text(TRACE_HEADER + "a,0,1,100000,64,512,4\n")
    files = {
        "j_profdir.yaml": _jobs(profiles__mlp_tiny="adir"),
        "j_fixed.yaml": _jobs(jobs__0__fixed_batch=1000, jobs__0__elastic=False),
        "j_gpus8.yaml": _jobs(jobs__0__gpus=8, jobs__0__elastic=False),
        "j_hugecap.yaml": _jobs(profiles__mlp_tiny__max_batch_per_gpu=10**15),
        "j_hugecap_float.yaml": _jobs(profiles__mlp_tiny__max_batch_per_gpu=1e15),
        "j_hugebatch.yaml": _jobs(jobs__0__max_batch=10**15),
        "j_seed.yaml": _jobs(jobs__0__seed=-3),
        "hpo_billing.yaml": _hpo(cloud__billing=["per_instance"]),
        "hpo_profdir.yaml": _hpo(trial__profile="adir"),
        "hpo_lu.yaml": _hpo(search_space={"lr": {"loguniform": [1e-3]}}),
        "hpo_badep.yaml": _hpo(entrypoint="i17_nosuch:fn"),
        "hpo_raising_ep.yaml": _hpo(entrypoint="i17_import_raises:f"),
    }
    files.update(service_inputs(root, _jobs))
    files.update(hostile_inputs(root, _jobs))
    for name, data in files.items():
        (root / name).write_text(yaml.safe_dump(data))
    for name, text in USER_MODULES.items():
        (root / name).write_text(text)
    (root / "envdir").mkdir()
    (root / "envdir" / ".env").write_bytes(binary)


def _c(id: str, args: str | list[str], *needles: str, env: dict[str, str] | None = None, cwd: str = ".", code: int = 2, absent: tuple[str, ...] = ()) -> BadInput:
    argv = tuple(args.split()) if isinstance(args, str) else tuple(args)
    return BadInput(id, argv, needles, tuple((env or {}).items()), cwd, code, tuple(absent))


MLP = "elastic_tasks.examples:mlp_tiny"
CASES: tuple[BadInput, ...] = (
    # plan: files that are directories, binary, or hold values the model cannot take
    _c("plan-missing", "plan nope.yaml", "nope.yaml", "no such file"),
    _c("plan-dir", "plan adir", "'adir'", "is a directory"),
    _c("plan-binary", "plan bin.yaml", "bin.yaml", "not UTF-8"),
    _c("plan-profile-dir", "plan j_profdir.yaml", "profiles.mlp_tiny", "is a directory"),
    _c("plan-fixed-batch-brackets", "plan j_fixed.yaml", "fixed_batch=1000", "[min_batch=32, max_batch=256]"),
    _c("plan-negative-seed", "plan j_seed.yaml", "seed=-3", "integer >= 0"),
    _c("plan-gpus-brackets", "plan j_gpus8.yaml", "requested_gpus=8", "[min_gpus=1, max_gpus=4]"),
    _c("plan-huge-cap", "plan j_hugecap.yaml", "max_batch_per_gpu=1000000000000000", "1,048,576"),
    _c("plan-huge-cap-float", "plan j_hugecap_float.yaml", "max_batch_per_gpu=1000000000000000.0"),
    _c("plan-huge-batch", "plan j_hugebatch.yaml", "max_batch=1000000000000000", "1,048,576"),
    # hpo plan / hpo run
    _c("hpo-dir", "hpo plan adir", "'adir'", "is a directory"),
    _c("hpo-binary", "hpo plan bin.yaml", "bin.yaml", "not UTF-8"),
    _c("hpo-billing-list", "hpo plan hpo_billing.yaml", "cloud.billing=['per_instance']"),
    _c("hpo-profile-dir", "hpo plan hpo_profdir.yaml", "trial.profile='adir'", "is a directory"),
    _c("hpo-loguniform-brackets", "hpo plan hpo_lu.yaml", "loguniform=[0.001]", "[low, high]"),
    _c("hpo-run-missing-entry", "hpo run hpo_badep.yaml", "entrypoint='i17_nosuch:fn'", "cannot import"),
    _c("hpo-run-raising-entry", "hpo run hpo_raising_ep.yaml", "i17_import_raises:f", "RuntimeError", "boom at import"),
    _c("hpo-run-timeout-negative", ["hpo", "run", str(HPO), "--timeout", "-1"], "--timeout=-1.0"),
    _c("hpo-run-timeout-nan", ["hpo", "run", str(HPO), "--timeout", "nan"], "--timeout=nan"),
    # simulate: nothing is written when the input is rejected
    _c("sim-dir-json", "simulate adir.json -o out", "adir.json", "is a directory"),
    _c("sim-profiles-file", "simulate good.csv --profiles afile -o out", "afile", "Not a directory"),
    _c("sim-out-file", ["simulate", str(JOBS), "--out", "afile"], "--out='afile'", "is a file"),
    _c("sim-empty-trace", "simulate empty.csv -o out", "empty.csv", "no jobs"),
    _c("sim-header-only", "simulate hdr.csv -o out", "hdr.csv", "no jobs"),
    _c("sim-extra-field", "simulate extra.csv -o out", "extra.csv row 1", "EXTRA"),
    _c("sim-binary-trace", "simulate bin.csv -o out", "bin.csv", "not UTF-8"),
    _c("sim-interval-nan", ["simulate", str(JOBS), "--interval", "nan", "-o", "out"], "--interval=nan"),
    _c("sim-interval-inf", ["simulate", str(JOBS), "--interval", "inf", "-o", "out"], "--interval=inf"),
    _c("sim-mixed-policy-kinds", ["simulate", str(JOBS), "-p", "elastic_dp", "-p", "idle_nodes_milp", "-o", "out"], "--policy='idle_nodes_milp'", "elastic_dp"),
    _c("sim-huge-cap", "simulate j_hugecap.yaml -o out", "max_batch_per_gpu=1000000000000000"),
    # idle-nodes
    _c("idle-save-trace-dir", "idle-nodes --save-trace adir --hours 0.1 --nodes 8", "--save-trace='adir'", "is a directory"),
    _c("idle-save-trace-bad-workload", "idle-nodes --save-trace s.csv --workload bogus", "--workload='bogus'"),
    _c("idle-trace-binary", "idle-nodes --trace bin.csv", "bin.csv", "not UTF-8"),
    _c("idle-trace-dir", "idle-nodes --trace adir", "'adir'", "Is a directory"),
    # profile, train, retrain: the user's entry point raising, and paths given the wrong way round
    _c("profile-cache-dir-file", f"profile {MLP} --cache-dir afile", "--cache-dir='afile'", "is a file"),
    _c("profile-out-dir", f"profile {MLP} --out adir", "--out='adir'", "is a directory"),
    _c("profile-entry-syntax", "profile i17_syntax:f", "i17_syntax:f", "SyntaxError"),
    _c("profile-entry-import-raises", "profile i17_import_raises:f", "RuntimeError", "boom at import"),
    _c("profile-entry-fn-raises", "profile i17_fns:boom", "i17_fns:boom", "KeyError", "inside"),
    _c("profile-entry-needs-args", "profile i17_fns:needs", "i17_fns:needs", "TypeError", "missing 1 required positional argument"),
    _c("train-entry-syntax", "train i17_syntax:f", "i17_syntax:f", "SyntaxError"),
    _c("train-entry-import-raises", "train i17_import_raises:f", "RuntimeError", "boom at import"),
    _c("train-entry-fn-raises", "train i17_fns:boom", "KeyError", "inside"),
    _c("train-entry-needs-args", "train i17_fns:needs", "TypeError", "missing 1 required positional argument"),
    _c("train-steps-zero", f"train {MLP} --steps 0", "--steps=0"),
    _c("train-timeout-negative", f"train {MLP} --timeout -1", "--timeout=-1.0"),
    _c("train-checkpoint-dir-file", f"train {MLP} --checkpoint-dir afile", "--checkpoint-dir='afile'", "is a file"),
    _c("retrain-entry-syntax", "retrain i17_syntax:f", "i17_syntax:f", "SyntaxError"),
    _c("retrain-entry-import-raises", "retrain i17_import_raises:f", "RuntimeError", "boom at import"),
    _c("retrain-entry-fn-raises", "retrain i17_fns:boom", "KeyError", "inside"),
    _c("retrain-entry-needs-args", "retrain i17_fns:needs", "TypeError", "missing 1 required positional argument"),
    _c("retrain-epochs-inf", f"retrain {MLP} --epochs inf", "--epochs=inf"),
    # run (the jobs file and settings are checked before any cluster or service starts)
    _c("run-dir", "run adir", "'adir'", "is a directory"),
    _c("run-binary", "run bin.yaml", "bin.yaml", "not UTF-8"),
    _c("run-fixed-batch-brackets", "run j_fixed.yaml", "fixed_batch=1000", "[min_batch=32, max_batch=256]"),
    _c("run-interval-inf", ["run", str(JOBS), "--interval", "inf"], "--interval=inf"),
    # quickstart, compare
    _c("quickstart-interval-inf", "quickstart --interval inf", "--interval=inf"),
    _c("quickstart-interval-nan", "quickstart --interval nan", "--interval=nan"),
    _c("compare-quote-in-id", ["compare", "abc'def"], "abc'def", "not an MLflow run id"),
    _c("compare-out-suffix", "compare --out od.v1", "--out='od.v1'", ".png"),
    # settings from the environment / .env
    _c("env-tracking-uri", "compare", "MALLEABLE_TRACKING_URI='not a uri://'", env={"MALLEABLE_TRACKING_URI": "not a uri://"}),
    _c("env-state-dir-file", "compare", "MALLEABLE_STATE_DIR='afile'", "is a file", env={"MALLEABLE_STATE_DIR": "afile"}),
    _c("env-interval-inf", "quickstart", "MALLEABLE_INTERVAL_S='inf'", env={"MALLEABLE_INTERVAL_S": "inf"}),
    _c("env-binary-dotenv", "compare", ".env", "not UTF-8", cwd="envdir"),
    _c("env-scheduler-address", "retrain", "MALLEABLE_SCHEDULER_ADDRESS='not an address'", env={"MALLEABLE_CLUSTER": "address", "MALLEABLE_SCHEDULER_ADDRESS": "not an address"}),
)

# The service's commands (issue 28): their own module, the same judge.
CASES = CASES + service_cases(_c, MLP, JOBS)
# Hostile input at every edge of the service (issue 37): secrets, URL arguments, damaged stores, non-files, sizes, settings, escapes.
CASES = CASES + hostile_cases(_c, MLP)


@dataclass(frozen=True)
class Outcome:
    case: BadInput
    exit_code: int
    lines: tuple[str, ...]
    traceback: bool
    written: tuple[str, ...] = field(default=())
    hung: bool = False  # ran past the case's time limit (a FIFO read, a server never answering)

    @property
    def clean(self) -> bool:
        """Exit code as asked, one line holding every needle, no traceback, nothing written."""
        return (
            not self.hung
            and self.exit_code == self.case.code
            and len(self.lines) == 1
            and all(n.lower() in self.lines[0].lower() for n in self.case.needles)
            and not any(a in "\n".join(self.lines) for a in self.case.absent)
            and not self.traceback
            and not self.written
        )


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out


class _Hung(BaseException):
    """Raised by the alarm: a BaseException, so no ``except Exception`` in the CLI swallows it."""


# Each case's limit: a bad input is refused in well under a second; a hang is a failure, not a wait.
CASE_LIMIT_S = 60


def run_case(case: BadInput, root: Path, limit_s: float = CASE_LIMIT_S) -> Outcome:
    """Run ``case`` in-process in the inputs directory ``root`` (made by ``make_inputs``), under
    ``limit_s`` (SIGALRM on the main thread; elsewhere, no limit)."""
    import signal
    import threading

    from typer.testing import CliRunner

    from flows.commands.cli import app

    before = snapshot(root)
    cwd, path, bytecode = os.getcwd(), list(sys.path), sys.dont_write_bytecode
    os.chdir(root / case.cwd)
    sys.path.insert(0, str(root))  # the user's entry-point modules
    sys.dont_write_bytecode = True  # importing them must not count as writing
    alarm = threading.current_thread() is threading.main_thread()

    def _raise(*_):
        raise _Hung()

    hung = False
    try:
        if alarm:
            old = signal.signal(signal.SIGALRM, _raise)
            signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            result = CliRunner(env={"COLUMNS": "250", **dict(case.env)}).invoke(app, list(case.args))
        except _Hung:
            hung, result = True, None
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        sys.dont_write_bytecode = bytecode
        for name in [m for m in sys.modules if m.startswith("i17_")]:
            del sys.modules[name]
    after = snapshot(root)
    written = tuple(sorted(p for p in after if before.get(p) != after[p]))
    if result is None:
        return Outcome(case, -1, (), False, written, hung=True)
    if isinstance(result.exception, _Hung):  # CliRunner caught it
        return Outcome(case, -1, (), False, written, hung=True)
    escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
    lines = tuple(line for line in result.output.splitlines() if line.strip())
    return Outcome(case, result.exit_code, lines, escaped or "Traceback" in result.output, written, hung)


def describe(outcome: Outcome) -> str:
    return json.dumps(
        {"case": outcome.case.id, "exit": outcome.exit_code, "lines": list(outcome.lines)[:5], "traceback": outcome.traceback, "hung": outcome.hung, "written": list(outcome.written)[:5]}
    )
