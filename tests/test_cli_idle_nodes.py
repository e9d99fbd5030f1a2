"""``malleable idle-nodes``: a real replay end to end, and one-line errors for bad input."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from flows.commands.cli import app

runner = CliRunner()


def test_idle_nodes_json_reports_every_policy(tmp_path) -> None:
    saved = tmp_path / "trace.csv"
    args = ["idle-nodes", "--nodes", "128", "--hours", "0.5", "--trainers", "3", "--save-trace", str(saved), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [r["policy"] for r in out["results"]] == ["idle_nodes_milp", "idle_nodes_greedy", "idle_nodes_fifo"]
    assert all(0 < r["utilisation"] <= 1.0 for r in out["results"])
    # --format json: the spelling every listing command takes (issue 35.8)
    again = runner.invoke(app, ["idle-nodes", "--trace", str(saved), "--policy", "idle_nodes_fifo", "--trainers", "3", "--format", "json"])
    assert again.exit_code == 0
    fifo = [r for r in out["results"] if r["policy"] == "idle_nodes_fifo"][0]
    assert json.loads(again.output)["results"][0]["utilisation"] == fifo["utilisation"]


def test_idle_nodes_bad_input_exits_2_with_one_line(tmp_path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time_s,node,state\n1,n0,maybe\n")
    for args in (["--trace", str(bad)], ["--policy", "elastic_dp"], ["--workload", "x"], ["--trainers", "0"], ["--format", "xml"]):
        result = runner.invoke(app, ["idle-nodes", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
