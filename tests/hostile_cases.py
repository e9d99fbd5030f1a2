"""Hostile input at every edge of the service (issue 37.6): written from the classes, several
cases each — secrets with odd characters, store URL arguments, read-only and damaged stores,
files that are not regular files (FIFO, device, huge, deeply nested), sizes a store cannot hold,
numeric settings without a finite bound, terminal control sequences, and client commands with no
store configured. Run with the rest of ``tests.bad_input_cases.CASES`` (same judge: exit 2, one
line naming field and value, no traceback, nothing written, no store created); a case's
``absent`` texts (a password in any spelling, a raw escape) must not be in its line."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

# Passwords with the characters a pattern stops at; each has a distinctive prefix, so finding it
# in the line is a leak, not a coincidence.
PASSWORDS = ("Zq7/s3c#r?t", "Zq7@at@sign", "Zq7%2Fenc%23", "Zq7'quo\"te", "Zq7;semi&amp=1")
ESC = "\x1b[31m"
BIG = 2**63
NO_STORE = {"MALLEABLE_JOB_STORE": ""}


def _nested(depth: int, json_form: bool) -> str:
    return "[" * depth + "]" * depth if json_form else "jobs: " + "[" * depth + "]" * depth + "\n"


def _store_with_a_job(path: Path) -> None:
    """A malleable store with one queued job (written as a service's client writes it), its WAL folded back."""
    from service.client import ServiceClient
    from service.store import JobStore
    from tests.service_helpers import job_entry

    store = JobStore(f"sqlite:///{path}")
    ServiceClient(store, submitter="alice@vm").submit(job_entry("a"))
    store.close()


def hostile_inputs(root: Path, jobs: Callable[..., dict]) -> dict[str, dict]:
    """Write the non-YAML inputs into ``root``; return the jobs files (name -> data) to write."""
    os.mkfifo(root / "fifo.yaml")
    os.mkfifo(root / "fifo.json")
    with open(root / "huge.yaml", "wb") as f:  # sparse: 65 MiB by its size, no disk
        f.truncate(65 * 2**20)
    (root / "deep.yaml").write_text(_nested(100_000, False))
    (root / "deep.json").write_text(_nested(100_000, True))
    (root / "deep200.json").write_text(_nested(200, True))
    for name, drop in (("nometa.db", "malleable_meta"), ("dropped.db", "malleable_allocations")):
        _store_with_a_job(root / name)
        with sqlite3.connect(root / name) as conn:
            conn.execute(f"DROP TABLE {drop}")
        conn.close()
    _store_with_a_job(root / "ro.db")
    with sqlite3.connect(root / "ro.db") as conn:  # a rollback journal: a read-only open needs no -shm beside it
        conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    return {
        "j_longid.yaml": jobs(jobs__0__id="i" * 300, jobs__0__workload="mlp_tiny"),
        "j_hugeid.yaml": jobs(jobs__0__id="h" * 100_000, jobs__0__workload="mlp_tiny"),
        "j_escid.yaml": jobs(jobs__0__id=f"a{ESC}b", jobs__0__workload="mlp_tiny"),
        "j_longwl.yaml": jobs(jobs__0__workload="m" * 10_000 + ":f"),
        "j_maxgpus.yaml": jobs(jobs__0__max_gpus=BIG, jobs__0__workload="mlp_tiny"),
        "j_priority.yaml": jobs(jobs__0__priority=2**70, jobs__0__workload="mlp_tiny"),
        "j_seed64.yaml": jobs(jobs__0__seed=2**64, jobs__0__workload="mlp_tiny"),
        "j_profile_fifo.yaml": jobs(profiles__mlp_tiny="fifo.json"),
        "j_profile_zero.yaml": jobs(profiles__mlp_tiny="/dev/zero"),
        "j_profile_deep.yaml": jobs(profiles__mlp_tiny="deep.json"),
    }


def hostile_cases(c: Callable[..., object], mlp: str) -> tuple:
    cases = []
    # 1. secrets with odd characters: in a store URL that is refused, the password never shows
    commands = (f"submit {mlp} --samples 100", "jobs", "cancel j0000000000a", "wait j0000000000a", "serve")
    for i, password in enumerate(PASSWORDS):
        url = f"foo://alice:{password}@db.internal/x"
        spelled = (password, quote(password, safe=""), password.split("/")[0] + "/" if "/" in password else password)
        cases.append(c(f"secret-{i}-{commands[i].split()[0]}", commands[i], "MALLEABLE_JOB_STORE", "alice:***@db.internal", env={"MALLEABLE_JOB_STORE": url}, absent=spelled))
    for i, password in enumerate(PASSWORDS[:3]):
        enc = quote(password, safe="")
        url = f"postgresql+psycopg://alice:{enc}@127.0.0.1:1/x?bogus=1"
        cases.append(c(f"secret-pg-arg-{i}", "jobs", "bogus", "alice:***@", env={"MALLEABLE_JOB_STORE": url}, absent=(password, enc)))
    cases.append(c("secret-tracking-uri", "compare", "MALLEABLE_TRACKING_URI", "***", env={"MALLEABLE_TRACKING_URI": f"not a uri://u:{PASSWORDS[0]}@h"}, absent=(PASSWORDS[0],)))
    cases.append(c(
        "secret-checkpoint-url", "compare", "MALLEABLE_CHECKPOINT_DIR", "***",
        env={"MALLEABLE_KUBE_CHECKPOINT_CLAIM": "claim", "MALLEABLE_CHECKPOINT_DIR": f"s3://AKIA:{PASSWORDS[1]}@bucket/x"}, absent=(PASSWORDS[1],),
    ))  # fmt: skip
    # 2. store URL arguments the driver refuses
    for name, args in (("submit", f"submit {mlp} --samples 100"), ("jobs", "jobs"), ("cancel", "cancel j0000000000a"), ("serve", "serve")):
        cases.append(c(f"store-arg-sqlite-{name}", args, "MALLEABLE_JOB_STORE", "timeout=abc", env={"MALLEABLE_JOB_STORE": "sqlite:///sub/jobs.db?timeout=abc"}))
    cases.append(c("store-arg-pg-option", "jobs", "bogus", env={"MALLEABLE_JOB_STORE": "postgresql+psycopg://u@127.0.0.1:1/x?bogus=1"}))
    cases.append(c("store-arg-pg-timeout", f"submit {mlp} --samples 100", "connect_timeout", env={"MALLEABLE_JOB_STORE": "postgresql+psycopg://u@127.0.0.1:1/x?connect_timeout=abc"}))
    # 3. read-only and damaged stores (a store that is not a malleable store is not an empty one)
    ro = {"MALLEABLE_JOB_STORE": "sqlite:///file:ro.db?mode=ro&uri=true"}
    cases.append(c("store-readonly-submit", f"submit {mlp} --samples 100", "ro.db", "read", env=ro))
    for name, args in (("jobs", "jobs"), ("submit", f"submit {mlp} --samples 100"), ("serve", "serve"), ("cancel", "cancel j0000000000a")):
        cases.append(c(f"store-nometa-{name}", args, "nometa.db", "malleable_meta", env={"MALLEABLE_JOB_STORE": "sqlite:///nometa.db"}))
        cases.append(c(f"store-dropped-{name}", args, "dropped.db", "malleable_allocations", env={"MALLEABLE_JOB_STORE": "sqlite:///dropped.db"}))
    # 4. files that are not regular files, too big, or nested too deep
    for where, args in (
        ("submit-file", "submit --file {}"), ("submit-profile", f"submit {mlp} --samples 100 --profile {{}}"), ("plan", "plan {}"), ("hpo", "hpo plan {}"),
    ):  # fmt: skip
        cases.append(c(f"file-fifo-{where}", args.format("fifo.yaml" if where != "submit-profile" else "fifo.json").split(), "fifo", "FIFO"))
        cases.append(c(f"file-dev-zero-{where}", args.format("/dev/zero").split(), "/dev/zero", "device"))
    cases.append(c("file-fifo-serve-teams", "serve --teams fifo.yaml", "fifo.yaml", "FIFO"))
    cases.append(c("file-fifo-run", "run fifo.yaml", "fifo.yaml", "FIFO"))
    cases.append(c("file-huge-plan", "plan huge.yaml", "huge.yaml", "68,157,440 bytes"))
    cases.append(c("file-huge-submit", "submit --file huge.yaml", "huge.yaml", "68,157,440 bytes"))
    cases.append(c("file-deep-submit", "submit --file deep.yaml", "deep.yaml", "nest"))
    cases.append(c("file-deep-plan-json", "plan deep.json", "deep.json", "nested more than"))
    cases.append(c("file-deep-profile", f"submit {mlp} --samples 100 --profile deep.json", "--profile='deep.json'", "nested more than"))
    cases.append(c("file-deep200-profile", f"submit {mlp} --samples 100 --profile deep200.json", "deep200.json", "nested more than"))
    cases.append(c("file-profile-ref-fifo", "plan j_profile_fifo.yaml", "profiles.mlp_tiny", "FIFO"))
    cases.append(c("file-profile-ref-dev-zero", "plan j_profile_zero.yaml", "profiles.mlp_tiny", "device"))
    cases.append(c("file-profile-ref-deep", "plan j_profile_deep.yaml", "profiles.mlp_tiny", "nested more than"))
    # 5. sizes every store must hold, the same for flags and files
    store = {"MALLEABLE_JOB_STORE": "sqlite:///never/jobs.db"}  # refused before it is made
    cases.append(c("size-file-id-300", "submit --file j_longid.yaml", "j_longid.yaml", ".id=", "255", env=store))
    cases.append(c("size-file-id-100k", "submit --file j_hugeid.yaml", "j_hugeid.yaml", "100,000 characters", "255", env=store))
    cases.append(c("size-file-id-escape", "submit --file j_escid.yaml", "j_escid.yaml", "control characters", env=store, absent=("\x1b",)))
    cases.append(c("size-file-workload-10k", "submit --file j_longwl.yaml", "j_longwl.yaml", "workload=", env=store))
    cases.append(c("size-file-max-gpus", "submit --file j_maxgpus.yaml", "max_gpus=9223372036854775808", env=store))
    cases.append(c("size-file-priority", "submit --file j_priority.yaml", "priority=1180591620717411303424", env=store))
    cases.append(c("size-file-seed", "submit --file j_seed64.yaml", "seed=18446744073709551616", env=store))
    cases.append(c("size-flag-max-gpus", f"submit {mlp} --samples 100 --max-gpus {BIG}", f"--max-gpus={BIG}", env=store))
    cases.append(c("size-flag-max-gpus-2p20", f"submit {mlp} --samples 100 --max-gpus {2**20 + 1}", f"--max-gpus={2**20 + 1}", env=store))
    cases.append(c("size-flag-priority", f"submit {mlp} --samples 100 --priority {2**70}", f"--priority={2**70}", env=store))
    cases.append(c("size-flag-name-100k", ["submit", mlp, "--samples", "100", "--name", "n" * 100_000], "--name=", "100,000", env=store))
    cases.append(c("size-flag-name-escape", ["submit", mlp, "--samples", "100", "--name", f"x{ESC}y"], "--name=", "control characters", env=store, absent=("\x1b",)))
    cases.append(c("size-flag-jobs-usage-gpus", f"jobs --usage --gpus {BIG}", f"--gpus={BIG}", env=store))
    cases.append(c("size-flag-key-newline", ["submit", mlp, "--samples", "100", "--key", "k\nforged"], "--key=", "control characters", env=store))
    # 6. numeric settings: finite and bounded
    for var, value, args in (
        ("TRACKING_TIMEOUT_S", "inf", "compare"), ("TRACKING_TIMEOUT_S", "nan", "compare"), ("TRACKING_TIMEOUT_S", "1e400", "compare"),
        ("TRACKING_TIMEOUT_S", "86400000", "compare"), ("SERVICE_POLL_S", "inf", "serve"), ("CHECKPOINT_EVERY", str(BIG), "serve"),
        ("WORKERS", str(BIG), "serve"), ("INTERVAL_S", "1e400", "serve"),
    ):  # fmt: skip
        cases.append(c(f"setting-{var.lower()}-{value[:6]}", args, f"MALLEABLE_{var}='{value}'", env={f"MALLEABLE_{var}": value}))
    # 7. terminal control sequences never reach the terminal raw
    cases.append(c("tty-compare-jobs-escape", ["compare", "--jobs", f"a{ESC}b"], "--jobs=", "\\x1b", absent=("\x1b",)))
    cases.append(c("tty-compare-submitter-bell", ["compare", "--submitter", "\x07alice"], "--submitter=", "\\x07", absent=("\x07",)))
    cases.append(c("tty-compare-jobs-newline", ["compare", "--jobs", "a\nforged row"], "--jobs=", "\\n", absent=("\n",)))
    cases.append(c("tty-compare-jobs-long", ["compare", "--jobs", "j" * 300], "--jobs=", "255"))
    # 8. client commands with no store configured: one line naming how to set it, never a private store
    cases.append(c("nostore-submit", f"submit {mlp} --samples 100", "MALLEABLE_JOB_STORE is not set", env=NO_STORE))
    cases.append(c("nostore-submit-file", "submit --file j_maxgpus.yaml", "max_gpus", env=NO_STORE))  # the file's own error first
    cases.append(c("nostore-jobs", "jobs", "MALLEABLE_JOB_STORE is not set", env=NO_STORE))
    cases.append(c("nostore-cancel", "cancel j0000000000a", "JOB_ID='j0000000000a'", "MALLEABLE_JOB_STORE is not set", env=NO_STORE))
    cases.append(c("nostore-wait", "wait j0000000000a", "JOB_ID='j0000000000a'", "MALLEABLE_JOB_STORE is not set", env=NO_STORE))
    return tuple(cases)
