"""What the step's trimmed bookkeeping (issue 34: the elastic step within 0.25 ms of plain DDP's
host time) must still do exactly: a world of one agrees without a collective, a step's meta and
outcome are the same values however they are built, the LR factor applies and comes off."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
import torch.distributed as dist

from elastic_tasks.rank import lr as lrs
from elastic_tasks.protocol import StepRecord
from elastic_tasks.rank.accounting.pending import PendingOutcome, StepSums
from elastic_tasks.rank.accounting.step_history import StepHistory
from elastic_tasks.rank.agreement import Agreement, StepOutcome
from elastic_tasks.rank.noise.deferred import Deferred
from elastic_tasks.rank.scaling import LRRamp
from elastic_tasks.rank.state.elastic import TrainMeta


def _outcome(step: int, loss_sum: float, correct: float) -> StepOutcome:
    return StepOutcome(step, loss_sum, correct, 12, throughput=480.0, global_batch=12, lr=0.05, t0=time.perf_counter(), cpu0=time.process_time(), group_lrs=(0.05, 0.5), eval_clock=7.5)


def test_a_world_of_one_agrees_on_its_own_values_without_a_process_group() -> None:
    if dist.is_initialized():
        pytest.skip("a process group of an earlier test is still up: the point is that none is needed")
    agreement = Agreement(rank=0, world=1)  # no process group at all: a collective would raise
    assert agreement.issue(_outcome(0, 6.0, 9.0), seen_version=3, noise_scale=None) is None
    first = agreement.issue(_outcome(1, 3.0, 12.0), seen_version=4, noise_scale=2.5)
    last = agreement.settle(noise_scale=None)
    # Step 0: 6.0 summed over 12 samples, 9 of them right; the version this rank had seen; its own throughput.
    assert (first.record.step, first.record.loss, first.record.accuracy, first.record.world_size) == (0, 0.5, 0.75, 1)
    assert (first.newest_version, first.throughput, first.eval_clock, first.record.noise_scale) == (3, (480.0,), 7.5, 2.5)
    assert first.record.group_lrs == (0.05, 0.5) and first.record.loss_samples is None
    assert (last.record.step, last.record.loss, last.record.accuracy, last.newest_version) == (1, 0.25, 1.0, 4)
    # Salvage after a failure: nothing in flight any more.
    assert agreement.salvage(noise_scale=None) is None


def test_a_world_of_one_salvages_the_step_in_flight_as_agreed() -> None:
    agreement = Agreement(rank=0, world=1)
    agreement.issue(_outcome(5, 1.5, 6.0), seen_version=1, noise_scale=None)
    salvaged = agreement.salvage(noise_scale=None)
    # Nothing to lose with no peer: the full record, not one over "this rank's own samples".
    assert (salvaged.record.step, salvaged.record.loss, salvaged.record.accuracy, salvaged.record.loss_samples) == (5, 0.125, 0.5, None)


def test_a_stepped_meta_is_the_meta_with_one_more_step() -> None:
    meta = TrainMeta(step=41, samples_seen=4100, global_batch=100, lr=LRRamp(0.1, 0.4, begin=3, steps=9), rng_state=b"rng", finished=True, cuda_rng_state=b"cuda")
    assert meta.stepped(100) == TrainMeta(42, 4200, 100, LRRamp(0.1, 0.4, begin=3, steps=9), b"rng", True, b"cuda")


def test_a_completed_step_keeps_every_field_and_scales_its_loss_by_the_global_batch() -> None:
    outcome = StepOutcome(7, 0.0, 0.0, 5, 250.0, 20, 0.3, 11.0, 12.0, (0.3, 0.03), 4.5)
    sums = StepSums()
    for weighted, hits in ((torch.tensor(0.125), torch.tensor(2)), (torch.tensor(0.25), torch.tensor(1))):
        sums.add(weighted, hits)
    done = PendingOutcome(outcome, sums.deferred()).complete()
    expected = {f.name: getattr(outcome, f.name) for f in dataclasses.fields(StepOutcome)}
    expected |= {"loss_sum": (0.125 + 0.25) * 20, "correct": 3.0}  # weighted by n / global batch: back to a sum
    assert {f.name: getattr(done, f.name) for f in dataclasses.fields(StepOutcome)} == expected


def test_a_step_without_hits_completes_with_none_correct() -> None:
    # A ``step_fn`` recipe has no hits (``recipe.loss`` gives None): the step's count stays 0.
    outcome = StepOutcome(3, 0.0, 0.0, 4, 100.0, 8, 0.1, 1.0, 2.0)
    sums = StepSums()
    sums.add(torch.tensor(0.5, requires_grad=True) * 1.0, None)
    done = PendingOutcome(outcome, sums.deferred()).complete()
    assert (done.loss_sum, done.correct) == (0.5 * 8, 0.0)


def test_deferred_values_of_any_shape_come_back_flat() -> None:
    assert Deferred(torch.tensor([[1.0, 2.0], [3.0, 4.0]])).values() == [1.0, 2.0, 3.0, 4.0]
    assert Deferred(torch.tensor([0.5, 1.5], requires_grad=True) * 2).values() == [1.0, 3.0]


@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_scaled_lrs_apply_the_factor_inside_and_give_each_group_its_own_back(factor: float) -> None:
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 0.1}, {"params": [params[1]], "lr": 0.25}])
    with lrs.scaled_lrs(opt, factor) as applied:
        inside = [g["lr"] for g in opt.param_groups]
    assert applied == pytest.approx((0.1 * factor, 0.25 * factor)) and inside == pytest.approx(list(applied))
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.25]
    with pytest.raises(ZeroDivisionError), lrs.scaled_lrs(opt, factor):
        1 / 0  # noqa: B018 - the block fails: the groups' own LRs come back all the same
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.25]


def test_step_records_without_group_lrs_read_back_equal() -> None:
    history = StepHistory()
    records = [StepRecord(0, 2.5, 0.5, 1, 8, 0.1), StepRecord(1, 2.0, 0.75, 2, 8, 0.1, group_lrs=(0.1, 0.2)), StepRecord(2, 1.5, 1.0, 2, 8, 0.1)]
    for r in records:
        history.append(r)
    assert list(history) == records
