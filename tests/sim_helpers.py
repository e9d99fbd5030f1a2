"""Shared pieces for simulator tests: the category profiles and small generated traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from allocator.types import JobSpec
from allocator.workloads.arrivals import ArrivalSpec, generate_jobs
from allocator.workloads.seed000 import load_category_profiles

PROFILES_DIR = Path(__file__).resolve().parents[1] / "examples" / "profiles"
PROFILES = load_category_profiles(PROFILES_DIR)


def small_trace(seed: int = 7, pattern: str = "high", horizon_min: float = 60.0, scale: float = 0.5) -> list[JobSpec]:
    return generate_jobs(ArrivalSpec(pattern, horizon_min, scale=scale), PROFILES, np.random.default_rng(seed))
