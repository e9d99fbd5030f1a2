"""Seed 000's four job categories (Table I) and the single-GPU run lengths of Section IV-G.

Profiles are not invented here: they are read from JSON files (``examples/profiles/
seed000_cat*.json``, written by ``examples/profiles/make_seed000_profiles.py``, whose
docstring documents the analytical model behind them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from allocator.profiles.io import profile_from_dict
from allocator.physics.throughput import baseline_rate
from allocator.types import JobSpec, ThroughputProfile


@dataclass(frozen=True, slots=True)
class Category:
    number: int
    model: str
    dataset: str
    params: int
    min_batch: int
    max_batch: int
    elastic: bool
    character: str
    single_gpu_minutes: float

    @property
    def profile_file(self) -> str:
        return f"seed000_cat{self.number}.json"


CATEGORIES: tuple[Category, ...] = (
    Category(1, "resnet50", "CIFAR100", 24_000_000, 32, 256, True, "compute bound", 16.0),
    Category(2, "alexnet", "CIFAR100", 58_000_000, 16, 256, True, "communication bound", 21.0),
    Category(3, "vgg11_bn", "CIFAR100", 10_000_000, 16, 1024, True, "balanced", 41.0),
    Category(4, "alexnet", "Food101", 58_000_000, 128, 128, False, "not elastic", 27.0),
)


def category(number: int) -> Category:
    for c in CATEGORIES:
        if c.number == number:
            return c
    raise ValueError(f"category={number!r}: seed 000 defines categories 1-4")


def load_category_profiles(directory: str | Path) -> dict[int, ThroughputProfile]:
    """Read the four category profiles from ``directory``; errors name the file."""
    profiles = {}
    for c in CATEGORIES:
        path = Path(directory) / c.profile_file
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"profile file {str(path)!r} for category {c.number}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:  # a directory, a file where the directory should be, binary
            raise ValueError(f"profile file {str(path)!r} for category {c.number}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"profile file {str(path)!r}: not valid JSON ({exc})") from None
        profiles[c.number] = profile_from_dict(data, str(path))
    return profiles


def make_job(
    job_id: str,
    cat: Category,
    profile: ThroughputProfile,
    arrival_time: float,
    max_gpus: int,
    minutes: float | None = None,
) -> JobSpec:
    """A job of a category whose work takes ``minutes`` (default: the category's) on one GPU
    at its largest batch — seed 000 defines job length that way. A non-elastic job runs its
    fixed batch on the fewest GPUs it fits on."""
    fixed_gpus = -(-cat.max_batch // profile.max_batch_per_gpu)
    probe = JobSpec(
        id=job_id,
        workload=f"{cat.model}-{cat.dataset}".lower(),
        total_samples=1,
        min_batch=cat.min_batch,
        max_batch=cat.max_batch,
        max_gpus=max_gpus if cat.elastic else fixed_gpus,
        requested_gpus=None if cat.elastic else fixed_gpus,
        profile=profile,
        elastic=cat.elastic,
        arrival_time=arrival_time,
        fixed_batch=None if cat.elastic else cat.max_batch,
    )
    samples = max(1, round((minutes if minutes is not None else cat.single_gpu_minutes) * 60.0 * baseline_rate(probe)))
    return JobSpec(
        id=probe.id,
        workload=probe.workload,
        total_samples=samples,
        min_batch=probe.min_batch,
        max_batch=probe.max_batch,
        max_gpus=probe.max_gpus,
        requested_gpus=probe.requested_gpus,
        profile=profile,
        elastic=probe.elastic,
        arrival_time=arrival_time,
        fixed_batch=probe.fixed_batch,
    )
