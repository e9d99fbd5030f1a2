"""Tables of how fair a run or the service was: per team and per submitter (``allocator.fairness.report``)."""

from __future__ import annotations

from rich.table import Table

from allocator.fairness.report import FairnessReport
from service.display import shown


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else fmt.format(x)


def teams_table(report: FairnessReport, title: str) -> Table:
    table = Table(title=title)
    table.add_column("team", no_wrap=True)
    for col in ("quota", "jobs", "done", "GPU-h", "entitled", "ratio", "max ρ", "mean ρ"):
        table.add_column(col, justify="right")
    for t in report.teams:
        if not t.jobs and not t.nominal_gpus:
            continue  # the default team nobody is in
        ratio = t.used_gpu_h / t.entitled_gpu_h if t.entitled_gpu_h > 0 else None
        table.add_row(
            shown(t.team), str(t.nominal_gpus), str(t.jobs), str(t.finished), f"{t.used_gpu_h:.2f}", f"{t.entitled_gpu_h:.2f}",
            _f(ratio, "{:.2f}"), _f(t.max_rho, "{:.2f}"), _f(t.mean_rho, "{:.2f}"),
        )  # fmt: skip
    table.caption = f"quota: nominal GPUs; GPU-h used, entitled and their ratio; Jain over teams (mean 1/ρ) {_f(report.jain, '{:.3f}')}, max ρ {_f(report.max_rho, '{:.2f}')}"
    return table


def submitters_table(report: FairnessReport) -> Table:
    table = Table(title="per submitter")
    table.add_column("submitter", no_wrap=True)
    table.add_column("team", no_wrap=True)
    for col in ("GPU-h", "entitled"):
        table.add_column(col, justify="right")
    for u in report.submitters:
        table.add_row(shown(u.name), shown(u.team), f"{u.used_gpu_h:.2f}", f"{u.entitled_gpu_h:.2f}")
    return table
