"""The CLI's root: help and --version import no heavy library; every command in the table loads."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from flows.commands.cli import COMMANDS, app

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "prefect", "mlflow", "distributed", "dask", "matplotlib", "pulp", "numpy")


def _modules_after(args: list[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    probe = (
        "import sys, json\n"
        "from flows.commands.cli import app\n"
        "try:\n"
        f"    app({args!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
    return done, loaded


def test_root_help_lists_every_command_without_importing_heavy_libraries():
    done, loaded = _modules_after(["--help"])
    for entry in COMMANDS:
        assert entry.name in done.stdout
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


def test_version_prints_the_package_version_and_imports_nothing_heavy():
    done, loaded = _modules_after(["--version"])
    assert done.stdout.startswith("malleable "), done.stdout
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


def test_every_summary_is_its_commands_docstring_first_line():
    for entry in COMMANDS:
        module_name, attribute = entry.target.split(":")
        target = getattr(importlib.import_module(module_name), attribute)
        doc = target.info.help if isinstance(target, typer.Typer) else inspect.getdoc(target)
        assert doc.splitlines()[0] == entry.summary, entry.name


def test_a_command_loads_on_use_and_a_typo_is_answered():
    result = CliRunner().invoke(app, ["plan", "--help"])
    assert result.exit_code == 0 and "--policy" in result.output, result.output
    result = CliRunner().invoke(app, ["plna"])
    assert result.exit_code == 2 and "plan" in result.output, result.output


def test_commands_without_a_flow_run_never_import_prefect():
    """plan, profile, simulate, idle-nodes, compare, ui, train, hpo plan: no Prefect, so no temporary server."""
    modules = ["flows.commands.plan", "flows.commands.profile", "flows.commands.simulate", "flows.commands.idle_nodes", "flows.commands.compare", "flows.commands.ui", "flows.commands.train", "flows.commands.hpo"]
    probe = f"import sys\nfor m in {modules!r}:\n    __import__(m)\nprint('prefect' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_command_modules_never_import_each_other():
    """Read from the sources (ast), not by importing: what two commands share lives beside them
    (flows/commands/ holds the commands, flows/commands/shared/ what they share; a command never
    imports another command)."""
    import ast
    from pathlib import Path

    from flows.commands.cli import COMMANDS

    root = Path(__file__).resolve().parents[1] / "flows" / "commands"
    commands = {entry.target.split(":")[0] for entry in COMMANDS}
    assert len(commands) >= 12
    offenders = []
    for module in sorted(commands):
        path = root / (module.rsplit(".", 1)[1] + ".py")
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.name} imports {m}" for m in modules if m in commands - {module}]
    assert offenders == []


def test_listing_jobs_loads_no_policy_and_no_solver(tmp_path, monkeypatch):
    # `malleable jobs --watch` is started often (and in loops): the store's records name the loop's
    # job states, which must not drag in every policy and the MILP solver's modeller on the way,
    # nor numpy (the loop's records' trust model) — also when a row is read back.
    from service.store import JobStore
    from service.client import ServiceClient
    from tests.service_helpers import job_entry

    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    monkeypatch.setenv("MALLEABLE_JOB_STORE", url)
    done, loaded = _modules_after(["jobs"])  # no store yet
    assert "state" in done.stdout and "Usage" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "pulp" not in loaded and not loaded & {"torch", "prefect", "mlflow", "distributed", "numpy"}, sorted(loaded & set(HEAVY))
    store = JobStore(url)
    ServiceClient(store, submitter="alice").submit(job_entry("listed-one"))
    store.close()
    done, loaded = _modules_after(["jobs"])
    assert "listed-one" in done.stdout, done.stdout + done.stderr
    assert not loaded & {"pulp", "numpy", "torch", "prefect", "mlflow", "distributed"}, sorted(loaded & set(HEAVY))


def test_the_cli_process_freezes_its_objects_at_exit_and_an_in_process_app_does_not(tmp_path):
    """``main`` (the console script, ``python -m malleable``) freezes what start-up made before the
    interpreter's exit, so its last collections skip it; ``app`` called inside another program
    (a test) leaves that program's collector alone. And `jobs` closes its store itself: sqlite's
    write-ahead log is gone once the last reader exits (the frozen exit would leave it)."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    from service.store import JobStore
    from service.client import ServiceClient
    from tests.service_helpers import job_entry

    store = JobStore(url)
    ServiceClient(store, submitter="alice").submit(job_entry("listed-one"))
    store.close()
    probe = (
        "import atexit, gc, sys\n"
        "from flows.commands.cli import app, main\n"
        "try:\n"
        "    app(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('in-process', gc.get_freeze_count())\n"
        "atexit.register(lambda: print('at exit', gc.get_freeze_count() > 1000))\n"
        "sys.argv = ['malleable', 'jobs']\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLEABLE_")}
    env.update(MALLEABLE_JOB_STORE=url, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "listed-one" in done.stdout, done.stdout + done.stderr
    assert "in-process 0\n" in done.stdout and "at exit True" in done.stdout, done.stdout
    assert not (tmp_path / "jobs.db-wal").exists() and (tmp_path / "jobs.db").exists()
