"""One job record end to end (issue 25): a JobSpec written by ``spec_to_dict`` reads back as the
same JobSpec field for field; the store keeps that form; a row the store wrote before (a
jobs-file entry: ``samples``, ``gpus``, ``deadline_s``) still reads, whole, into the loop."""

from __future__ import annotations

import dataclasses
import json
import math
import threading

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update

from allocator.physics.noise import NoiseTrajectory
from allocator.profiles.io import profile_to_dict
from allocator.specs import spec_from_dict, spec_to_dict
from allocator.types import AllreduceModel, JobSpec, ThroughputProfile
from service.store import schema
from service.client import ServiceClient
from service.feed import StoreFeed
from service.jobs.jobspec import spec_from_entry
from service.store.records import Submission
from service.store import JobStore
from tests.factories import make_profile
from tests.service_helpers import job_entry

_times = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)


@st.composite
def noise_scales(draw) -> NoiseTrajectory:
    value = st.floats(min_value=1e-3, max_value=1e9, allow_nan=False) | st.just(math.inf)
    if draw(st.booleans()):
        return NoiseTrajectory.constant(draw(value))
    inner = sorted(draw(st.sets(st.floats(min_value=1e-6, max_value=1 - 1e-6, allow_nan=False), min_size=1, max_size=4)))
    return NoiseTrajectory((0.0, *inner, 1.0), tuple(draw(value) for _ in range(len(inner) + 1)))


@st.composite
def profiles(draw) -> ThroughputProfile:
    sizes = sorted(draw(st.sets(st.integers(1, 4096), min_size=1, max_size=6)))
    times = sorted(draw(st.floats(min_value=1e-6, max_value=10.0, allow_nan=False)) for _ in sizes)
    ring = st.builds(AllreduceModel, _times, st.floats(min_value=0.0, max_value=1e-3, allow_nan=False))
    return ThroughputProfile(
        workload=draw(st.text(min_size=1, max_size=12)), num_params=draw(st.integers(1, 10**10)), batch_sizes=tuple(sizes),
        iter_times_s=tuple(times), max_batch_per_gpu=draw(st.integers(1, 4096)), allreduce=draw(ring),
        hardware=draw(st.text(max_size=12)), inter_host=draw(st.none() | ring), noise_scale=draw(st.none() | noise_scales()),
    )  # fmt: skip


@st.composite
def job_specs(draw) -> JobSpec:
    """Mostly valid JobSpecs: ranges drawn inside each other; a draw JobSpec refuses is discarded."""
    min_batch = draw(st.integers(1, 4096))
    max_batch = draw(st.integers(min_batch, min_batch + 4096))
    max_gpus = draw(st.integers(1, 64))
    min_gpus = draw(st.integers(1, max_gpus))
    try:
        return JobSpec(
            id=draw(st.text(min_size=1, max_size=16)), workload=draw(st.text(min_size=1, max_size=24)),
            total_samples=draw(st.integers(1, 10**15)), min_batch=min_batch, max_batch=max_batch, max_gpus=max_gpus,
            profile=draw(profiles()), elastic=draw(st.booleans()), arrival_time=draw(_times), min_gpus=min_gpus,
            requested_gpus=draw(st.none() | st.integers(min_gpus, max_gpus)), fixed_batch=draw(st.none() | st.integers(min_batch - 1, max_batch)),
            priority=draw(st.integers(-1000, 1000)), deadline=draw(st.none() | _times), seed=draw(st.none() | st.integers(0, 2**40)),
            noise_scale=draw(st.none() | noise_scales()), base_batch=draw(st.none() | st.integers(1, 10**6)),
        )  # fmt: skip
    except ValueError:
        assume(False)  # e.g. fixed_batch below min_batch
        raise


def _same_fields(a: JobSpec, b: JobSpec) -> None:
    for f in dataclasses.fields(JobSpec):
        assert getattr(a, f.name) == getattr(b, f.name), f.name


@settings(max_examples=300, deadline=None)
@given(job_specs())
def test_a_job_spec_comes_back_field_for_field_through_json(spec):
    text = json.dumps(spec_to_dict(spec))
    _same_fields(spec_from_dict(json.loads(text)), spec)


@settings(max_examples=50, deadline=None)
@given(job_specs(), st.sampled_from(["id", "workload", "total_samples", "min_batch", "max_batch", "max_gpus", "profile"]))
def test_a_missing_or_unknown_field_is_named(spec, required):
    data = spec_to_dict(spec)
    del data[required]
    with pytest.raises(ValueError, match=rf"\.{required}: missing required field"):
        spec_from_dict(data)
    with pytest.raises(ValueError, match=r"\.samples: unknown field"):
        spec_from_dict({**spec_to_dict(spec), "samples": 5})


# -- the store ---------------------------------------------------------------------------------

# A job as the store wrote it before the record had its own form: a jobs-file entry.
def _old_entry(job_id: str) -> dict:
    return {
        "id": job_id, "workload": "mlp_tiny", "profile": profile_to_dict(make_profile()), "samples": 321,
        "min_batch": 16, "max_batch": 64, "max_gpus": 2, "min_gpus": 1, "gpus": 2, "elastic": True, "priority": 3,
        "deadline_s": 50.0, "seed": 7, "noise_scale": 120.0,
    }  # fmt: skip


def _expected(job_id: str) -> JobSpec:
    return JobSpec(
        id=job_id, workload="mlp_tiny", total_samples=321, min_batch=16, max_batch=64, max_gpus=2, profile=make_profile(),
        min_gpus=1, requested_gpus=2, priority=3, deadline=50.0, seed=7, noise_scale=NoiseTrajectory.constant(120.0),
    )  # fmt: skip


def _overwrite_spec(store: JobStore, job_id: str, data: dict) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(schema.jobs).where(schema.jobs.c.id == job_id).values(spec=json.dumps(data)))


def _raw_spec(store: JobStore, job_id: str) -> dict:
    with store.engine.connect() as conn:
        return json.loads(conn.execute(select(schema.jobs.c.spec).where(schema.jobs.c.id == job_id)).scalar_one())


def test_a_new_row_holds_the_record_under_its_field_names_and_the_store_id(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    job_id = ServiceClient(store).submit(job_entry("a", samples=500, workload="mlp_tiny")).job_id
    assert job_id != "a"  # the store's own id; the submitter's name stays beside it
    assert store.job(job_id).name == "a"
    assert _raw_spec(store, job_id) == {
        "id": job_id, "workload": "mlp_tiny", "total_samples": 500, "min_batch": 16, "max_batch": 64, "max_gpus": 2,
        "profile": profile_to_dict(make_profile()), "elastic": True, "arrival_time": 0.0, "min_gpus": 1, "requested_gpus": 1, "priority": 0,
    }  # fmt: skip


def test_a_row_written_in_the_old_format_reads_whole_into_the_loop(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    job_id = ServiceClient(store).submit(job_entry("kept", workload="mlp_tiny")).job_id
    _overwrite_spec(store, job_id, _old_entry("kept"))
    _same_fields(store.job(job_id).job_spec(), _expected(job_id))
    feed = StoreFeed(store, threading.Event(), listen=False)
    arrived = feed.poll(5.0).jobs
    assert len(arrived) == 1
    # The loop's copy carries its row's submitter (the store's identity, issue 36), never the file's.
    _same_fields(arrived[0], dataclasses.replace(_expected(job_id), arrival_time=5.0, submitter=store.job(job_id).submitter))


def test_a_retry_finds_its_job_written_in_the_old_format(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    client = ServiceClient(store)
    entry = {k: v for k, v in _old_entry("kept").items()}
    first = client.submit(entry, idempotency_key="k").job_id
    _overwrite_spec(store, first, _old_entry("kept"))
    again = client.submit(entry, idempotency_key="k")
    assert (again.job_id, again.created) == (first, False)


def test_a_store_private_to_one_run_keeps_the_jobs_own_ids(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    spec = spec_from_entry(job_entry("from-the-file", workload="mlp_tiny"))
    done = store.submit(Submission(spec.id, spec, "run", keep_id=True))
    assert done.job_id == "from-the-file" and store.job("from-the-file").job_spec().id == "from-the-file"
