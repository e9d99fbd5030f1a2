"""What the CLI says when a request is not met: warnings and one-line errors, never tracebacks."""

from __future__ import annotations

import pytest

from tests.processes import stop

from flows.commands.train import missed_rescales


def _result(moves: list[tuple[int, int, int]]):
    """A JobResult whose generations are (step, before, after) after a start on ``moves[0][2]`` GPUs."""
    from elastic_tasks.coordinator.outcomes import JobResult, RescaleOutcome
    from elastic_tasks.protocol import PlanKind

    kinds = list(PlanKind)
    rescales = tuple(RescaleOutcome(v, kinds[0], b, a, 32, s, 0.0, 0.0) for v, (s, b, a) in enumerate(moves))
    return JobResult("j", True, 40, 1280, (), rescales, (), (), (), None, None)


def test_a_rescale_that_never_happened_is_reported():
    result = _result([(0, 0, 2), (28, 2, 1)])  # asked: 20 -> 1 (done late, at 28) and 39 -> 2 (never)
    assert missed_rescales([(20, 1), (39, 2)], result) == [(39, 2)]
    assert missed_rescales([(20, 1)], result) == []
    assert missed_rescales([(30, 1)], result) == [(30, 1)]  # a move before the requested step is not it


def test_workers_without_the_gpu_resource_are_named_at_once():
    from distributed import Client, LocalCluster

    from flows.retrain_flow import NoGpuWorkersError, wait_for_workers

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        with pytest.raises(NoGpuWorkersError, match=r"0 of the 1 Dask workers offer the GPU resource.*--resources GPU=1"):
            wait_for_workers.fn(client, 1, timeout_s=30)  # the task's body; the task does not retry this error


def test_mixed_models_side_by_side_are_flagged():
    from flows.recording.comparison import ComparedRun, mixed_models_warning

    def run(name: str, workloads: tuple[str, ...]) -> ComparedRun:
        return ComparedRun(name, name, "real", "elastic_dp", "4", (), (), workloads)

    assert mixed_models_warning([run("a", ("mlp_tiny",)), run("b", ("mlp_tiny",))]) is None
    warning = mixed_models_warning([run("a", ("mlp_tiny",)), run("b", ("resnet_small",))])
    assert warning is not None and "a: mlp_tiny" in warning and "b: resnet_small" in warning


def test_compare_table_reads_at_80_columns():
    from pathlib import Path

    from rich.console import Console

    from flows.commands.compare import HEADINGS, comparison_table
    from flows.recording.comparison import ComparedRun, Comparison

    summary = tuple((k, 123.456) for k in HEADINGS)
    runs = tuple(ComparedRun(f"id{i}", name, "simulated", "elastic_dp", "64", summary, ()) for i, name in enumerate(["elastic", "fixed-batch-baseline", "idle-nodes"]))
    console = Console(width=80, record=True, force_terminal=False)
    console.print(comparison_table(Comparison(runs, Path("x.png"))))
    text = console.export_text()
    assert "…" not in text, text
    for heading in [*HEADINGS.values(), "elastic", "fixed-batch-baseline", "idle-nodes"]:
        assert heading in text, text
    assert max(len(line) for line in text.splitlines()) <= 80


SCHEDULER_WITHOUT_MALLEABLE = """
import asyncio, sys
root = sys.argv[1]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if p.rstrip("/") != root and p not in ("", ".")]
from distributed import Scheduler

async def main():
    async with Scheduler(host="127.0.0.1", port=0, dashboard_address=None) as s:
        print("ADDRESS", s.address, flush=True)
        await s.finished()

asyncio.run(main())
"""


@pytest.mark.slow
def test_a_scheduler_without_the_package_is_named_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from distributed import Client

    from flows.cluster_flow import warm_up_workers
    from flows.retrain_flow import MissingPackageError

    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, "-c", SCHEDULER_WITHOUT_MALLEABLE, root], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        address = next(line.split()[1] for line in proc.stdout if line.startswith("ADDRESS"))
        with Client(address, timeout=60) as client:
            with pytest.raises(MissingPackageError, match=r"cannot import 'elastic_tasks'.*install malleable"):
                warm_up_workers.fn(client, ["elastic_tasks.examples:mlp_tiny"])
    finally:
        stop(proc)
