"""Bad inputs for the service's commands (issue 28.2-3): serve, submit, jobs, cancel, wait, and
the plan/compare cases found beside them. Run by tests/test_bad_inputs.py and
benchmarks/faults_bench.py with the rest of ``tests.bad_input_cases.CASES``: each must be exit 2,
one line naming the field and the value, no traceback, and no store (or any file) written —
the inputs directory has no ``.malleable`` before and must have none after."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

TEAM_ONLY = {"MALLEABLE_ALLOWED_ENTRYPOINTS": "team_models.*"}
BAD_STORES = {
    "foo": ("foo://bar/baz", ("MALLEABLE_JOB_STORE", "'foo'")),
    "memory": ("sqlite:///:memory:", ("MALLEABLE_JOB_STORE", ":memory:")),
    "memory-bare": ("sqlite://", ("MALLEABLE_JOB_STORE", "in-memory")),
    "under-file": ("sqlite:///afile/jobs.db", ("MALLEABLE_JOB_STORE", "afile/jobs.db")),
    "is-dir": ("sqlite:///adir", ("MALLEABLE_JOB_STORE", "adir", "directory")),
    "not-url": ("not a url", ("MALLEABLE_JOB_STORE", "not a url")),
    "no-driver": ("mysql://u@localhost/db", ("MALLEABLE_JOB_STORE", "mysql", "driver")),
}


def service_inputs(root: Path, jobs: Callable[..., dict]) -> dict[str, dict]:
    """The jobs files the cases below read (written by ``make_inputs``)."""
    return {
        "j_hugesamples.yaml": jobs(jobs__0__samples=10**20),
        "j_mingpus8.yaml": jobs(jobs__0__min_gpus=8, jobs__0__max_gpus=8),
    }


def service_cases(c: Callable[..., object], mlp: str, jobs_file: Path) -> tuple:
    big = "9223372036854775808"
    cases = [
        # numbers the store cannot hold, or no job could mean
        c("submit-samples-2p63", f"submit {mlp} --samples {big}", f"--samples={big}", "2^63-1"),
        c("submit-samples-huge", f"submit {mlp} --samples 99999999999999999999", "--samples=99999999999999999999"),
        c("submit-samples-zero", f"submit {mlp} --samples 0", "--samples=0"),
        c("submit-samples-negative", f"submit {mlp} --samples -5", "--samples=-5"),
        c("submit-epochs-inf", f"submit {mlp} --epochs inf --dataset-samples 100", "--epochs=inf"),
        c("submit-epochs-nan", f"submit {mlp} --epochs nan --dataset-samples 100", "--epochs=nan"),
        c("submit-epochs-negative", f"submit {mlp} --epochs -1 --dataset-samples 100", "--epochs=-1.0"),
        c("submit-dataset-huge", f"submit {mlp} --epochs 1 --dataset-samples 100000000000000000000", "--dataset-samples=100000000000000000000"),
        c("submit-dataset-zero", f"submit {mlp} --epochs 1 --dataset-samples 0", "--dataset-samples=0"),
        c("submit-epochs-product", f"submit {mlp} --epochs 1e10 --dataset-samples 1000000", "--epochs=10000000000.0", "--dataset-samples=1000000"),
        c("submit-epochs-no-dataset", f"submit {mlp} --epochs 2", "--epochs", "--dataset-samples"),
        c("submit-samples-and-epochs", f"submit {mlp} --samples 5 --epochs 1", "--samples", "--epochs"),
        c("submit-no-work", f"submit {mlp}", "--samples", "--epochs"),
        # entry points: form, allow-list, importable
        c("submit-entry-empty", ["submit", "", "--samples", "100"], "ENTRYPOINT=''"),
        c("submit-entry-colon", "submit : --samples 100", "ENTRYPOINT=':'"),
        c("submit-entry-space", ["submit", "a b:c", "--samples", "100"], "ENTRYPOINT='a b:c'"),
        c("submit-entry-digit", "submit 9lives:f --samples 100", "ENTRYPOINT='9lives:f'"),
        c("submit-entry-two-colons", "submit a:b:c --samples 100", "ENTRYPOINT='a:b:c'"),
        c("submit-entry-missing-module", "submit i28_no_such_pkg.mod:fn --samples 100", "ENTRYPOINT='i28_no_such_pkg.mod:fn'", "i28_no_such_pkg"),
        c("submit-entry-missing-submodule", "submit elastic_tasks.i28_nope:fn --samples 100", "elastic_tasks.i28_nope"),
        c("submit-entry-not-allowed", f"submit {mlp} --samples 100", "elastic_tasks.examples", "MALLEABLE_ALLOWED_ENTRYPOINTS", env=TEAM_ONLY),
        c("submit-example-not-allowed", "submit mlp_tiny --samples 100", "ENTRYPOINT='mlp_tiny'", "MALLEABLE_ALLOWED_ENTRYPOINTS", env=TEAM_ONLY),
        c("submit-user-module-not-allowed", "submit i17_fns:boom --samples 100", "i17_fns", "MALLEABLE_ALLOWED_ENTRYPOINTS", env=TEAM_ONLY),
        # the job's shape
        c("submit-min-gpus-zero", f"submit {mlp} --samples 100 --min-gpus 0", "min_gpus=0"),
        c("submit-gpus-brackets", f"submit {mlp} --samples 100 --min-gpus 3 --max-gpus 2", "min_gpus=3", "max_gpus=2"),
        c("submit-min-batch-zero", f"submit {mlp} --samples 100 --min-batch 0", "min_batch=0"),
        c("submit-batch-brackets", f"submit {mlp} --samples 100 --min-batch 512 --max-batch 64", "min_batch=512", "max_batch=64"),
        c("submit-huge-batch", f"submit {mlp} --samples 100 --max-batch 1000000000000000", "max_batch=1000000000000000"),
        c("submit-name-too-long", ["submit", mlp, "--samples", "100", "--name", "n" * 300], "--name=", "255"),
        c("submit-name-empty", ["submit", mlp, "--samples", "100", "--name", ""], "--name=''"),
        c("submit-key-empty", ["submit", mlp, "--samples", "100", "--key", ""], "--key=''"),
        c("submit-profile-missing", f"submit {mlp} --samples 100 --profile nope.json", "--profile='nope.json'"),
        c("submit-profile-dir", f"submit {mlp} --samples 100 --profile adir", "--profile='adir'"),
        c("submit-profile-binary", f"submit {mlp} --samples 100 --profile bin.yaml", "--profile='bin.yaml'"),
        # entry point or --file, and --file with flags it would ignore
        c("submit-entry-and-file", ["submit", mlp, "--file", str(jobs_file)], "ENTRYPOINT", "--file"),
        c("submit-neither", "submit", "ENTRYPOINT", "--file"),
        c("submit-file-with-samples", ["submit", "--file", str(jobs_file), "--samples", "5"], "--samples=5", "--file="),
        c("submit-file-with-max-gpus", ["submit", "--file", str(jobs_file), "--max-gpus", "0"], "--max-gpus=0", "--file="),
        c("submit-file-with-name", ["submit", "--file", str(jobs_file), "--name", "x"], "--name=x", "--file="),
        c("submit-file-with-epochs", ["submit", "--file", str(jobs_file), "--epochs", "2"], "--epochs=2.0", "--file="),
        c("submit-file-huge-samples", "submit --file j_hugesamples.yaml", "j_hugesamples.yaml", "samples=100000000000000000000"),
        c("submit-file-missing", "submit --file nope.yaml", "nope.yaml"),
        c("submit-file-dir", "submit --file adir", "adir", "is a directory"),
        c("submit-file-binary", "submit --file bin.yaml", "bin.yaml", "not UTF-8"),
        c("submit-file-not-allowed", ["submit", "--file", str(jobs_file)], "workload='mlp_tiny'", "MALLEABLE_ALLOWED_ENTRYPOINTS", env=TEAM_ONLY),
        # read-only commands: bad input, and never a store made for it
        c("jobs-format", "jobs --format xml", "--format='xml'"),
        c("jobs-interval-zero", "jobs --watch --interval 0", "--interval=0.0"),
        c("jobs-interval-nan", "jobs --watch --interval nan", "--interval=nan"),
        c("cancel-unknown", "cancel j0000000000a", "JOB_ID='j0000000000a'"),
        c("cancel-unknown-two", "cancel j0000000000a nope", "JOB_ID='j0000000000a'"),
        c("wait-unknown", "wait j0000000000a", "JOB_ID='j0000000000a'"),
        c("wait-timeout-negative", "wait j0000000000a --timeout -1", "--timeout=-1.0"),
        c("wait-timeout-nan", "wait j0000000000a --timeout nan", "--timeout=nan"),
        c("wait-timeout-inf", "wait j0000000000a --timeout inf", "--timeout=inf"),
        # serve: policies it cannot run, stores that cannot be
        c("serve-idle-nodes-milp", "serve --policy idle_nodes_milp", "--policy='idle_nodes_milp'", "node names"),
        c("serve-idle-nodes-fifo", "serve --policy idle_nodes_fifo", "--policy='idle_nodes_fifo'", "node names"),
        c("serve-idle-nodes-greedy", "serve --policy idle_nodes_greedy", "--policy='idle_nodes_greedy'", "node names"),
        c("serve-unknown-policy", "serve --policy nope", "nope"),
        c("serve-interval-inf", "serve --interval inf", "--interval=inf"),
        c("run-idle-nodes-milp", ["run", str(jobs_file), "--policy", "idle_nodes_milp"], "--policy='idle_nodes_milp'", "node names"),
        c("run-simulate-idle-nodes-fifo", ["run", str(jobs_file), "--simulate", "--policy", "idle_nodes_fifo"], "--policy='idle_nodes_fifo'", "node names"),
        # plan and compare
        c("plan-unfittable-job", "plan j_mingpus8.yaml", "min_gpus=8", "gpus=4"),
        c("compare-out-dir", "compare --out adir", "--out='adir'", "is a directory"),
    ]
    for kind, (url, needles) in BAD_STORES.items():
        env = {"MALLEABLE_JOB_STORE": url}
        cases.append(c(f"submit-store-{kind}", f"submit {mlp} --samples 100", *needles, env=env))
        cases.append(c(f"jobs-store-{kind}", "jobs", *needles, env=env))
        cases.append(c(f"cancel-store-{kind}", "cancel j0000000000a", *needles, env=env))
        cases.append(c(f"wait-store-{kind}", "wait j0000000000a", *needles, env=env))
        cases.append(c(f"serve-store-{kind}", "serve", *needles, env=env))
    return tuple(cases)
