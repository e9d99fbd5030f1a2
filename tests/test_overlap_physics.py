"""Allreduce overlapping the backward pass (a profile's γ), its fit, and Pollux's traces converted with it.

Oracles are computed here by hand: the step (compute^γ + allreduce^γ)^(1/γ) from the profile's
numbers, and a tiny artifact-shaped trace whose step times are generated from known γ and ring
coefficients, so the conversion must give those back.
"""

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from allocator.physics.goodput import efficiency, goodput_table, step_time
from allocator.physics.throughput import throughput
from allocator.physics.topology import fit_overlapped_topology, fit_topology
from allocator.profiles.io import profile_from_dict, profile_to_dict
from allocator.types import AllreduceModel, ThroughputProfile
from benchmarks.pollux_trace import NOMINAL_PARAMS, fitted_noise_scale, load_application, padded_envelope
from tests.factories import make_job


def _profile(overlap: float, latency_s: float = 0.01) -> ThroughputProfile:
    return ThroughputProfile(
        workload="w", num_params=1_000, batch_sizes=(10, 20), iter_times_s=(0.1, 0.2), max_batch_per_gpu=20,
        allreduce=AllreduceModel(latency_s=latency_s), overlap=overlap,
    )  # fmt: skip


@pytest.mark.parametrize("overlap", [1.0, 2.0, 3.5])
def test_step_overlaps_the_allreduce_with_the_last_micro_step(overlap):
    profile = _profile(overlap)
    spec = make_job(profile=profile, min_batch=10, max_batch=160, max_gpus=8)
    comm = 2 * (4 - 1) * 0.01  # ring latency only: 2 (k - 1) hops on k = 4 GPUs
    last = (0.1**overlap + comm**overlap) ** (1 / overlap)
    # 80 samples on 4 GPUs in 2 micro-steps: 10 per rank each; the allreduce overlaps only the second.
    assert step_time(spec, 80, 4, accum_steps=2) == pytest.approx(0.1 + last, rel=1e-12)
    assert throughput(profile, 80, 4, accum_steps=2) == pytest.approx(80 / (0.1 + last), rel=1e-12)
    assert step_time(spec, 40, 4) == pytest.approx(last, rel=1e-12)
    # One GPU has no allreduce, whatever γ.
    assert step_time(spec, 20, 1) == pytest.approx(0.2, rel=1e-12)


def test_overlap_never_beats_the_slower_part_nor_exceeds_the_sum():
    comm = 2 * 3 * 0.05
    for overlap in (1.0, 1.5, 4.0, 10.0):
        spec = make_job(profile=_profile(overlap, latency_s=0.05), min_batch=10, max_batch=160, max_gpus=8)
        t = step_time(spec, 40, 4)
        assert max(0.1, comm) - 1e-12 <= t <= 0.1 + comm + 1e-12
    assert step_time(make_job(profile=_profile(10.0, 0.05), min_batch=10, max_batch=160, max_gpus=8), 40, 4) < step_time(
        make_job(profile=_profile(1.5, 0.05), min_batch=10, max_batch=160, max_gpus=8), 40, 4
    )


def test_goodput_table_values_the_overlapped_step():
    profile = _profile(2.0)
    spec = make_job(profile=profile, min_batch=40, max_batch=40, max_gpus=8, base_batch=10)
    table = goodput_table(spec, 4, noise_scale=100.0)
    comm = 2 * 3 * 0.01
    expected = 40 / math.sqrt(0.1**2 + comm**2) * (100 + 10) / (100 + 40)
    assert int(table.batches[4]) == 40
    assert float(table.goodput[4]) == pytest.approx(expected, rel=1e-12)
    assert float(efficiency(100.0, 10, 40)) == pytest.approx(110 / 140)


def test_profile_file_carries_overlap_and_names_a_bad_one():
    profile = _profile(2.5)
    data = profile_to_dict(profile)
    assert data["overlap"] == 2.5
    assert profile_from_dict(data).overlap == 2.5
    assert "overlap" not in profile_to_dict(_profile(1.0))
    with pytest.raises(ValueError, match=r"overlap.*0\.5"):
        profile_from_dict({**data, "overlap": 0.5})
    with pytest.raises(ValueError, match="overlap"):
        replace(profile, overlap=float("nan"))


def _ring(latency_s: float, seconds_per_param: float, params: int, gpus: int) -> float:
    return 2 * (gpus - 1) * latency_s + 2 * (gpus - 1) / gpus * params * seconds_per_param


def test_fit_recovers_overlap_and_both_rings_from_exact_steps():
    intra, inter, gamma = (0.004, 0.0), (0.002, 2e-8), 2.5
    rows = []
    for compute in (0.05, 0.2, 0.6):
        for gpus, hosts in ((2, 1), (4, 1), (8, 2), (16, 4), (64, 16)):
            lat, spp = intra if hosts == 1 else inter
            comm = _ring(lat, spp, 10_000_000, gpus)
            rows.append((10_000_000, gpus, hosts, compute, (compute**gamma + comm**gamma) ** (1 / gamma)))
    got_intra, got_inter, got_gamma = fit_overlapped_topology(rows)
    assert got_gamma == pytest.approx(gamma)
    assert (got_intra.latency_s, got_intra.seconds_per_param) == pytest.approx(intra, abs=1e-9)
    assert got_inter.latency_s == pytest.approx(inter[0], rel=1e-6)
    assert got_inter.seconds_per_param == pytest.approx(inter[1], rel=1e-6)


def test_fit_without_overlap_is_the_plain_ring_fit():
    rows = [(1000, k, h, c, c + _ring(0.001 if h == 1 else 0.003, 1e-6, 1000, k)) for c in (0.1, 0.3) for k, h in ((2, 1), (4, 1), (8, 2), (12, 3))]
    intra, inter, gamma = fit_overlapped_topology(rows)
    assert gamma == 1.0
    assert (intra, inter) == fit_topology([(p, k, h, s - c) for p, k, h, c, s in rows])
    with pytest.raises(ValueError, match="compute=0"):
        fit_overlapped_topology([(1000, 2, 1, 0.0, 0.1)])


def test_fitted_noise_scale_follows_the_large_batch_trace():
    # With one batch above B0 the fit matches Pollux's efficiency there exactly: P = that batch's PGNS.
    assert fitted_noise_scale(100, {100: 50.0, 800: 3000.0}) == pytest.approx(3000.0, rel=1e-6)
    # Equal PGNS everywhere: that PGNS.
    assert fitted_noise_scale(100, {100: 400.0, 200: 400.0, 800: 400.0}) == pytest.approx(400.0, rel=1e-9)
    # No signal left at any batch above B0: no noise limit.
    assert math.isinf(fitted_noise_scale(100, {100: 50.0, 800: math.inf}))


def _write(path: Path, header: list[str], rows: list[list[object]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def test_pollux_trace_converts_to_the_step_times_and_noise_it_was_made_from(tmp_path):
    """A tiny artifact trace: one-GPU times t(b) = 0.02 + 0.004 b, multi-GPU steps from γ = 2 and two rings."""
    trace = tmp_path / "traces" / "imagenet"
    trace.mkdir(parents=True)
    gamma, intra, inter = 2.0, (0.01, 0.0), (0.003, 1e-8)
    locals_ = (10, 20, 40)
    compute = {b: 0.02 + 0.004 * b for b in locals_}

    def step(b: int, gpus: int, nodes: int) -> float:
        lat, spp = intra if nodes == 1 else inter
        comm = _ring(lat, spp, NOMINAL_PARAMS, gpus)
        return (compute[b] ** gamma + comm**gamma) ** (1 / gamma)

    placements = [["1", b, compute[b], 0.0] for b in locals_]
    placements += [[p, b, step(b, sum(map(int, p)), len(p)), 0.0] for p in ("2", "4", "22", "44") for b in locals_]
    _write(trace / "placements.csv", ["placement", "local_bsz", "step_time", "sync_time"], placements)
    scal = [[n, r, b, step(b, r, n), 0.0] for n, r in ((4, 16), (16, 64)) for b in locals_]
    _write(trace / "scalability.csv", ["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"], scal)
    # Two traced batches, B0 = 100 and 400; 90 epochs (imagenet's max_epochs), progress in B0-steps.
    stats = {100: (2.0, 3.0), 400: (1.0, 9.0)}  # (grad_sqr, grad_var) at every epoch
    for batch, (sqr, var) in stats.items():
        rows = [[1000.0 * (e + 1) + (batch == 400), 0, 0.5, sqr, var] for e in range(90)]
        _write(trace / f"validation-{batch}.csv", ["progress", "iteration", "metric", "grad_sqr", "grad_var"], rows)

    app = load_application("imagenet", tmp_path)
    assert app.profile.overlap == pytest.approx(gamma)
    spec = make_job(profile=app.profile, min_batch=100, max_batch=400, max_gpus=64)
    for b in locals_:
        for gpus in (2, 4, 8, 16, 64):
            nodes = -(-gpus // 4)
            assert step_time(spec, b * gpus, gpus, gpus_per_host=4) == pytest.approx(step(b, gpus, nodes), rel=1e-6)
    # Pollux's PGNS of the batch above B0 (B0 x var / sqr = 100 x 9 / 1), every epoch.
    assert app.noise.values == pytest.approx([100 * 9.0 / 1.0] * 90, rel=1e-6)
    # Work: the smaller progress after the last epoch (90,000 B0-steps) x B0.
    assert app.work_samples == 90_000 * 100
    assert np.isclose(app.noise.bounds[1], 1000 / 90_000)


def test_padded_envelope_lowers_a_batch_to_a_larger_faster_one():
    # Each time is the least at that batch or any larger one (a batch padded to a faster larger one).
    assert padded_envelope((1.0, 0.9, 2.0, 1.5)) == (0.9, 0.9, 1.5, 1.5)
    assert padded_envelope((0.1, 0.2, 0.3)) == (0.1, 0.2, 0.3)


def test_pollux_trace_keeps_a_larger_batch_that_runs_faster_in_every_placement(tmp_path):
    """yolov3's shape: local 20 runs faster than local 10 on one GPU and in every placement traced.
    The profile keeps the traced time at 20 (10 is lowered to it, never 20 raised), and the allreduce
    is fitted against the one-GPU step at each measurement's own local batch, so the steps at 20 and
    40 come back exactly."""
    trace = tmp_path / "traces" / "imagenet"
    trace.mkdir(parents=True)
    gamma, intra, inter = 2.0, (0.01, 0.0), (0.003, 1e-8)
    compute = {10: 0.08, 20: 0.06, 40: 0.18}

    def step(b: int, gpus: int, nodes: int) -> float:
        lat, spp = intra if nodes == 1 else inter
        return (compute[b] ** gamma + _ring(lat, spp, NOMINAL_PARAMS, gpus) ** gamma) ** (1 / gamma)

    placements = [["1", b, t, 0.0] for b, t in compute.items()]
    placements += [[p, b, step(b, sum(map(int, p)), len(p)), 0.0] for p in ("2", "4", "22", "44") for b in compute]
    _write(trace / "placements.csv", ["placement", "local_bsz", "step_time", "sync_time"], placements)
    scal = [[n, r, b, step(b, r, n), 0.0] for n, r in ((4, 16), (16, 64)) for b in compute]
    _write(trace / "scalability.csv", ["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"], scal)
    for batch in (100, 400):
        rows = [[1000.0 * (e + 1), 0, 0.5, 1.0, 9.0] for e in range(90)]
        _write(trace / f"validation-{batch}.csv", ["progress", "iteration", "metric", "grad_sqr", "grad_var"], rows)

    app = load_application("imagenet", tmp_path)
    assert app.profile.iter_times_s == pytest.approx((0.06, 0.06, 0.18))
    assert app.profile.overlap == pytest.approx(gamma)
    spec = make_job(profile=app.profile, min_batch=100, max_batch=400, max_gpus=64)
    for b in (20, 40):
        for gpus in (1, 2, 4, 8, 16, 64):
            expected = compute[b] if gpus == 1 else step(b, gpus, -(-gpus // 4))
            assert step_time(spec, b * gpus, gpus, gpus_per_host=4) == pytest.approx(expected, rel=1e-6)
