"""Construction-time validation of the core types: every bad value names its field."""

import pytest

from allocator.types import (
    Allocation,
    AllreduceModel,
    ClusterSnapshot,
    RescaleEvent,
    RescaleKind,
    RunningJob,
    Share,
    ThroughputProfile,
    validate_allocation,
)
from tests.factories import make_job, make_profile


def test_profile_rejects_empty_and_non_monotone():
    with pytest.raises(ValueError, match=r"batch_sizes=\(\).*empty"):
        ThroughputProfile("w", 10, (), (), 8)
    with pytest.raises(ValueError, match="iter_times_s.*non-decreasing"):
        ThroughputProfile("w", 10, (1, 2, 4), (0.1, 0.05, 0.2), 8)
    with pytest.raises(ValueError, match="batch_sizes.*strictly increasing"):
        ThroughputProfile("w", 10, (2, 2), (0.1, 0.2), 8)
    with pytest.raises(ValueError, match="num_params=0"):
        ThroughputProfile("w", 0, (1,), (0.1,), 8)
    with pytest.raises(ValueError, match="latency_s=-1"):
        AllreduceModel(latency_s=-1)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"min_batch": 300}, "min_batch=300"),
        ({"max_gpus": 0}, "max_gpus=0"),
        ({"max_gpus": -2}, "max_gpus=-2"),
        ({"total_samples": 0}, "total_samples=0"),
        ({"requested_gpus": 9}, "requested_gpus=9"),
        ({"fixed_batch": 512}, "fixed_batch=512"),
        ({"arrival_time": float("nan")}, "arrival_time=nan"),
        ({"id": ""}, "id=''"),
    ],
)
def test_jobspec_errors_name_job_and_field(overrides, field):
    with pytest.raises(ValueError) as err:
        make_job("job-x", **overrides)
    assert field in str(err.value)


def test_share_and_allocation():
    share = Share(gpus=3, global_batch=100)
    assert share.batch_per_gpu == 34
    assert Share(gpus=2, global_batch=64, accum_steps=2).batch_per_gpu == 16
    with pytest.raises(ValueError, match="Share.global_batch=2"):
        Share(gpus=3, global_batch=2)
    alloc = Allocation.of({"a": Share(1, 8), "b": Share(2, 16)})
    assert alloc.total_gpus == 3 and alloc["b"].gpus == 2 and "a" in alloc and alloc.get("z") is None
    assert list(alloc) == ["a", "b"]
    with pytest.raises(ValueError, match="job appears twice"):
        Allocation((("a", Share(1, 8)), ("a", Share(1, 8))))


def test_snapshot_checks_capacity_and_duplicates():
    job = make_job("a")
    with pytest.raises(ValueError, match="exceed capacity"):
        ClusterSnapshot(0.0, 2, running=(RunningJob(job, Share(3, 48)),))
    with pytest.raises(ValueError, match="unique"):
        ClusterSnapshot(0.0, 4, running=(RunningJob(job, Share(1, 16)),), queued=(job,))
    snap = ClusterSnapshot(0.0, 4, running=(RunningJob(job, Share(1, 16)),))
    assert snap.free_gpus == 3


def test_validate_allocation_catches_each_breach():
    job = make_job("a", max_gpus=4, profile=make_profile(cap=64))
    snap = ClusterSnapshot(0.0, 8, queued=(job,))
    validate_allocation(Allocation.of({"a": Share(2, 64)}), snap, required=["a"])
    with pytest.raises(ValueError, match="gpus=5"):
        validate_allocation(Allocation.of({"a": Share(5, 64)}), snap)
    with pytest.raises(ValueError, match="batch_per_gpu=128"):
        validate_allocation(Allocation.of({"a": Share(1, 128)}), snap)
    with pytest.raises(ValueError, match="global_batch=8"):
        validate_allocation(Allocation.of({"a": Share(1, 8)}), snap)
    with pytest.raises(ValueError, match="admitted but got no GPUs"):
        validate_allocation(Allocation(), snap, required=["a"])


def test_rescale_event():
    ev = RescaleEvent(1.0, "a", Share(1, 8), Share(2, 16), RescaleKind.IN_PLACE, cost_s=0.5)
    assert ev.kind == "in_place"
    with pytest.raises(ValueError, match="cost_s=-1"):
        RescaleEvent(1.0, "a", None, Share(1, 8), RescaleKind.START, cost_s=-1)
    with pytest.raises(ValueError, match="cost_s=nan"):
        RescaleEvent(1.0, "a", None, Share(1, 8), RescaleKind.START, cost_s=float("nan"))
    # A measured start whose job had ended before it trained: its cost is unknown, not a number.
    assert RescaleEvent(1.0, "a", None, Share(1, 8), RescaleKind.START, cost_s=None, measured=True).cost_s is None
