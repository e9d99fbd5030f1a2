"""A run's fairness (``allocator.fairness.report``) as MLflow metrics on its parent run."""

from __future__ import annotations

import re

from allocator.fairness.report import FairnessReport


def _name(text: str) -> str:
    """A team or submitter as an MLflow metric name may spell it (letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^\w.\- /]", "_", text)[:100]


def fairness_metrics(report: FairnessReport) -> dict[str, float]:
    """``fairness_max_rho``, ``fairness_jain``, and per team / submitter ``team.<name>.used_gpu_h`` ...
    (a figure that is undefined, such as ρ of a team with no finished job, is left out)."""
    out: dict[str, float | None] = {"fairness_max_rho": report.max_rho, "fairness_jain": report.jain}
    for t in report.teams:
        if not t.jobs:
            continue
        key = f"team.{_name(t.team)}"
        out |= {f"{key}.nominal_gpus": float(t.nominal_gpus), f"{key}.used_gpu_h": t.used_gpu_h, f"{key}.entitled_gpu_h": t.entitled_gpu_h,
                f"{key}.max_rho": t.max_rho, f"{key}.mean_rho": t.mean_rho}  # fmt: skip
    for u in report.submitters:
        out |= {f"submitter.{_name(u.name)}.used_gpu_h": u.used_gpu_h, f"submitter.{_name(u.name)}.entitled_gpu_h": u.entitled_gpu_h}
    return {k: float(v) for k, v in out.items() if v is not None}
