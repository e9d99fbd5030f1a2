"""One policy, one schedule, by every route that builds it (issue 38).

The routes: the CLI (``malleable simulate -p NAME``), Python (``make_policy(NAME)`` into
``allocator.simulator.simulate``), the simulate flow's task, the service's configured policy
(``ServiceConfig.build_policy``) and ``simulate --rerun`` of the CLI's own ``summary.json``. The
run charges 30 s per change, so a route that plans with another pause (the CLI once passed
``--in-place-cost`` to goodput_dp while ``make_policy`` kept 1 s) gives another schedule.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from allocator.loop import LoopSettings
from allocator.metrics import schedule_csv
from allocator.policies import available_policies, make_policy
from allocator.simulator import RescaleCost, simulate
from flows.commands.cli import app
from flows.config.jobfile import load_jobs_file
from flows.simulation.choices import file_stem
from flows.simulate_flow import simulate_loop
from service.runner import ServiceConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "profiles"
# The loop's policies (the idle-node ones replay node traces: tests/test_cli_idle_nodes.py).
LOOP_POLICIES = tuple(p for p in available_policies() if not p.startswith("idle_nodes"))
GPUS, INTERVAL_S, CHANGE_S, START_S = 8, 60.0, 30.0, 10.0


def jobs_file(path: Path) -> Path:
    """Seven jobs over three profiles arriving within a minute, two sharing a named trajectory."""
    profiles = {"resnet": "h100_resnet50-cifar100.json", "alexnet": "h100_alexnet-cifar100.json", "vgg": "h100_vgg11bn-cifar100.json"}
    jobs = [
        {"id": f"j{i}", "profile": ("resnet", "alexnet", "vgg")[i % 3], "samples": 10_000 * (1 + i % 4), "min_batch": 32, "max_batch": 512,
         "max_gpus": 8, "arrival_s": 6 * i, "noise_scale": "rising" if i % 2 else 150 + 40 * i}
        for i in range(7)
    ]  # fmt: skip
    data = {
        "gpus": GPUS,
        "profiles": {name: str(EXAMPLES / file) for name, file in profiles.items()},
        "noise_scales": {"rising": {"fractions": [0, 0.5], "values": [120, 900]}},
        "jobs": jobs,
    }
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_policy_gives_one_schedule_by_every_route(tmp_path):
    path = jobs_file(tmp_path / "jobs.yaml")
    jobs = list(load_jobs_file(path).jobs)
    loop, cost = LoopSettings(interval_s=INTERVAL_S), RescaleCost(in_place_s=CHANGE_S, start_s=START_S)
    flags = ["--interval", str(INTERVAL_S), "--in-place-cost", str(CHANGE_S), "--start-cost", str(START_S), "--no-plots"]
    runner = CliRunner()
    cli = runner.invoke(app, ["simulate", str(path), *[a for name in LOOP_POLICIES for a in ("-p", name)], *flags, "-o", str(tmp_path / "cli")])
    assert cli.exit_code == 0, cli.output
    again = runner.invoke(app, ["simulate", "--rerun", str(tmp_path / "cli" / "summary.json"), "--no-plots", "-o", str(tmp_path / "rerun")])
    assert again.exit_code == 0, again.output
    differ = {}
    for name in LOOP_POLICIES:
        service = ServiceConfig(store_url="sqlite://", checkpoint_root=str(tmp_path / "ckpt"), policy=name).build_policy()
        routes = {
            "cli": (tmp_path / "cli" / f"schedule-{file_stem(name)}.csv").read_text(),
            "python": schedule_csv(simulate(jobs, make_policy(name), GPUS, loop, cost)),
            "flow": schedule_csv(simulate_loop.fn(jobs, name, GPUS, loop, CHANGE_S, START_S)[0]),
            "service": schedule_csv(simulate(jobs, service, GPUS, loop, cost)),
            "rerun": (tmp_path / "rerun" / f"schedule-{file_stem(name)}.csv").read_text(),
        }
        assert routes["python"].count("\n") > len(jobs), name  # the run did something
        if len(set(routes.values())) != 1:
            differ[name] = sorted(route for route, text in routes.items() if text != routes["python"])
    assert differ == {}


IDLE_POLICIES = tuple(p for p in available_policies() if p.startswith("idle_nodes"))


def test_every_idle_node_policy_gives_one_replay_by_every_route():
    """The idle-node policies replay a node trace: ``malleable idle-nodes`` against ``replay`` with
    ``make_policy(NAME)`` and the replay's own defaults (the curves and costs it charges are the ones
    the policy plans with, whichever route built it)."""
    import json

    import numpy as np

    from allocator.idle_nodes.replay import replay, trainer_spec
    from allocator.idle_nodes.table2 import TABLE2
    from allocator.idle_nodes.trace import generate_trace
    from flows.idle_replay import result_row

    args = ["idle-nodes", "--json", "--nodes", "64", "--hours", "1", "--trainers", "3", "--seed", "0"]
    cli = CliRunner().invoke(app, [*args, *[a for name in IDLE_POLICIES for a in ("--policy", name)]])
    assert cli.exit_code == 0, cli.output
    by_cli = {row["policy"]: row for row in json.loads(cli.output)["results"]}
    idle = generate_trace(np.random.default_rng(0), nodes=64, hours=1.0)
    jobs = [trainer_spec(f"t{i:03d}", "shufflenet", TABLE2["shufflenet"], 10**13) for i in range(3)]
    timing = ("median_solve_s", "max_solve_s")  # wall times of the solver, not decisions
    differ = {}
    for name in IDLE_POLICIES:
        ours = {k: v for k, v in result_row(replay(idle, jobs, make_policy(name), TABLE2, max_parallel=3)).items() if k not in timing}
        theirs = {k: v for k, v in by_cli[name].items() if k not in timing}
        assert ours["decisions"] > 0
        if ours != theirs:
            differ[name] = sorted(k for k in ours if ours[k] != theirs[k])
    assert differ == {}
