"""Elastic trainer pieces that need no processes: sharding, hybrid scaling, state, stragglers."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_tasks.coordinator.lifecycle import CoordinatorState, Lifecycle
from elastic_tasks.protocol import FROM_CHECKPOINT, Plan, PlanKind, TrainConfig
from elastic_tasks.rank.scaling import LRRamp, accumulation_steps, initial_lr, micro_batches, plan_accumulation, rescale_lr
from elastic_tasks.rank.data.sharding import EpochSampler, rank_slice
from elastic_tasks.rank.state.elastic import ElasticState, TrainMeta, has_checkpoint, read_meta
from elastic_tasks.rank.health.straggler import StragglerDetector


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 200),
    seed=st.integers(0, 1000),
    schedule=st.lists(st.tuples(st.integers(1, 64), st.integers(1, 8), st.integers(1, 6)), min_size=1, max_size=8),
)
def test_every_sample_of_an_epoch_once_whatever_the_batches_and_world_sizes(n, seed, schedule):
    """Steps with changing global batch and world size: ranks' slices partition each step, and
    the stream's first n positions are a permutation of the data set (and so is each later epoch)."""
    sampler = EpochSampler(n, seed)
    seen, pos = [], 0
    for batch, world, steps in schedule:
        world = min(world, batch)
        for _ in range(steps):
            step = sampler.step_indices(pos, batch)
            parts = [step[slice(*rank_slice(batch, world, r))] for r in range(world)]
            assert sorted(np.concatenate(parts).tolist()) == sorted(step.tolist())
            assert all(len(p) >= 1 for p in parts)
            seen.extend(np.concatenate(parts).tolist())
            pos += batch
    for epoch in range(len(seen) // n):
        assert sorted(seen[epoch * n : (epoch + 1) * n]) == list(range(n))
    tail = seen[(len(seen) // n) * n :]
    assert len(set(tail)) == len(tail)


def test_sampler_is_deterministic_across_instances_and_epochs_differ():
    a, b = EpochSampler(100, 7), EpochSampler(100, 7)
    assert np.array_equal(a.step_indices(130, 40), b.step_indices(130, 40))
    assert not np.array_equal(a.permutation(0), a.permutation(1))


def test_rank_slice_uneven_and_bad_values():
    assert [rank_slice(10, 3, r) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(ValueError, match="global_batch=2"):
        rank_slice(2, 3, 0)
    with pytest.raises(ValueError, match="rank"):
        rank_slice(10, 3, 3)


def test_progressive_linear_lr_follows_seed_002():
    lr = initial_lr(0.1, 32, 64)
    assert lr.at(0) == pytest.approx(0.2)
    ramp = rescale_lr(lr, step=100, old_batch=64, new_batch=256, ramp_steps=10)
    assert ramp.at(100) == pytest.approx(0.2)
    assert ramp.at(105) == pytest.approx(0.2 + 0.5 * (0.8 - 0.2))
    assert ramp.at(110) == ramp.at(1000) == pytest.approx(0.8)
    # Mid-ramp change: start from where the LR is, aim at the scaled target.
    back = rescale_lr(ramp, step=105, old_batch=256, new_batch=128, ramp_steps=10)
    assert back.start == pytest.approx(0.5) and back.target == pytest.approx(0.4)
    assert rescale_lr(lr, 5, 64, 64, 10) is lr
    with pytest.raises(ValueError, match="LRRamp.start"):
        LRRamp(0.0, 1.0)


def test_accumulation_keeps_micro_batches_under_the_cap():
    assert accumulation_steps(64, 2, None) == 1
    assert accumulation_steps(64, 2, 32) == 1
    assert accumulation_steps(64, 2, 16) == 2
    assert accumulation_steps(65, 2, 16) == 3  # largest local share is 33
    chunks = micro_batches(33, 3)
    assert chunks == [(0, 11), (11, 22), (22, 33)]
    assert micro_batches(2, 3) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match="max_batch_per_gpu=0"):
        accumulation_steps(64, 2, 0)
    with pytest.raises(ValueError, match="global_batch=1"):
        accumulation_steps(1, 2, 4)


def test_the_plans_accumulation_is_taken_whole_and_checked_against_the_cap():
    # None: the trainer's own rule. A number: used as given, if its micro-batches fit the cap.
    assert plan_accumulation(None, 64, 2, 16) == 2
    assert plan_accumulation(4, 64, 2, 16) == 4  # more micro-steps than the cap needs: the policy's call
    assert plan_accumulation(3, 64, 2, None) == 3
    with pytest.raises(ValueError, match=r"Plan.accum_steps=1: micro-batches of 32 .* exceed max_batch_per_gpu=16"):
        plan_accumulation(1, 64, 2, 16)  # 32 per rank in one micro-step
    with pytest.raises(ValueError, match=r"Plan.accum_steps=40: global batch 64 leaves"):
        plan_accumulation(40, 64, 2, None)
    with pytest.raises(ValueError, match=r"Plan.accum_steps=0"):
        plan_accumulation(0, 64, 2, None)
    with pytest.raises(ValueError, match=r"Plan.accum_steps=3: global batch 4 leaves"):
        Plan(1, PlanKind.RESCALE, ("a", "b"), 4, accum_steps=3)
    assert Plan(1, PlanKind.RESCALE, ("a", "b"), 12, accum_steps=3).accum_steps == 3


def test_loss_scaling_makes_the_update_independent_of_the_split():
    """sum(local losses)/global_batch on each rank, summed over ranks, equals the full-batch mean."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(10, 5), torch.randint(0, 3, (10,))
    full = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), model.weight)[0]
    for world in (1, 3, 4):
        total = torch.zeros_like(full)
        for r in range(world):
            a, b = rank_slice(10, world, r)
            for c0, c1 in micro_batches(b - a, 2):
                xs, ys = x[a + c0 : a + c1], y[a + c0 : a + c1]
                loss = torch.nn.functional.cross_entropy(model(xs), ys) * len(ys) / 10
                total += torch.autograd.grad(loss, model.weight)[0]
        assert torch.allclose(total, full, atol=1e-6)


def _state(seed: int) -> ElasticState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    meta = TrainMeta(step=0, samples_seen=0, global_batch=8, lr=LRRamp(0.1, 0.1), rng_state=b"")
    state = ElasticState(model, opt, meta)
    state.capture_rng()
    return state


def test_checkpoint_round_trip_is_exact_and_atomic(tmp_path):
    state = _state(0)
    for _ in range(3):
        state.optimizer.zero_grad()
        state.model(torch.randn(8, 4)).sum().backward()
        state.optimizer.step()
    state.meta = TrainMeta(step=3, samples_seen=24, global_batch=8, lr=LRRamp(0.1, 0.2, 3, 5), rng_state=b"")
    torch.manual_seed(123)
    state.save(tmp_path)
    expected_draw = torch.rand(3)
    assert not list(tmp_path.glob(".state-*"))  # no temp file left behind
    other = _state(1)  # different init, empty optimizer state
    other.load(tmp_path)
    for a, b in zip(state.model.state_dict().values(), other.model.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(state.model.parameters(), other.model.parameters()):
        assert torch.equal(state.optimizer.state[p]["momentum_buffer"], other.optimizer.state[q]["momentum_buffer"])
    assert other.meta.step == 3 and other.meta.samples_seen == 24 and other.meta.lr == LRRamp(0.1, 0.2, 3, 5)
    assert torch.equal(torch.rand(3), expected_draw)  # RNG restored to the saved point
    assert has_checkpoint(tmp_path) and read_meta(tmp_path).step == 3
    with pytest.raises(FileNotFoundError, match="checkpoint_dir"):
        other.load(tmp_path / "missing")


def test_straggler_flagged_within_the_ewma_bound():
    det = StragglerDetector(alpha=0.1, threshold=0.8)
    bound = StragglerDetector.steps_to_flag(0.5)
    flagged_at = None
    for step in range(50):
        newly = det.update({"a": 100.0, "b": 101.0, "c": 50.0, "d": 99.0})
        if newly:
            assert newly == ["c"]
            flagged_at = step + 1
            break
    assert flagged_at == bound == 5
    # One slow step among fast ones is not persistent.
    det2 = StragglerDetector()
    det2.update({"a": 100.0, "b": 10.0, "c": 100.0})
    assert not det2.flagged
    with pytest.raises(ValueError, match="fraction"):
        StragglerDetector.steps_to_flag(0.9)


def test_config_and_plan_reject_bad_values():
    with pytest.raises(ValueError, match="global_batch=0"):
        TrainConfig(global_batch=0, max_steps=1)
    with pytest.raises(ValueError, match="max_steps or total_samples"):
        TrainConfig(global_batch=8)
    with pytest.raises(ValueError, match="checkpoint_every"):
        TrainConfig(global_batch=8, max_steps=1, checkpoint_every=5)
    with pytest.raises(ValueError, match="global_batch=2"):
        Plan(0, PlanKind.START, ("a", "b", "c"), 2)
    with pytest.raises(ValueError, match="Plan.source"):
        Plan(0, PlanKind.START, ("a",), 2, source="z")
    assert Plan(1, "rescale", ("a",), 4, source=FROM_CHECKPOINT).kind is PlanKind.RESCALE
    for bad in (19.9, float("inf"), True):  # under two control timeouts (10 s each), not finite, a bool
        with pytest.raises(ValueError, match=r"plan_wait_s=.*>= 2 x timeout_s \(20\)"):
            TrainConfig(global_batch=8, max_steps=1, timeout_s=10.0, plan_wait_s=bad)


def test_the_plan_wait_is_the_configured_one_else_a_minute_or_four_control_timeouts():
    from elastic_tasks.coordinator.timeouts import plan_wait_s, rendezvous_wait_s

    assert plan_wait_s(TrainConfig(global_batch=8, max_steps=1, timeout_s=10.0)) == 60.0  # the floor
    assert plan_wait_s(TrainConfig(global_batch=8, max_steps=1, timeout_s=30.0)) == 120.0  # 4 collectives of 30 s
    short = TrainConfig(global_batch=8, max_steps=1, timeout_s=10.0, plan_wait_s=20.0)
    assert plan_wait_s(short) == 20.0 and rendezvous_wait_s(short, patient=True) == 20.0
    assert rendezvous_wait_s(short, patient=False) == 10.0  # a running generation's switch: one control timeout


class _RacingBoard:
    """Plan version 1 gets published while the courier long-polls for it, and the rank's own
    refresh() reads the latest version (1) before the courier's wait returns."""

    def __init__(self) -> None:
        import threading

        self.latest = 0
        self.waiting = threading.Event()
        self.release = threading.Event()

    def wait_published(self, version: int, timeout: float) -> bool:
        if version == 1:
            self.waiting.set()
            self.release.wait(5)
            return True
        self.release.wait(timeout)  # nothing newer is ever published
        return False

    def latest_version(self) -> int:
        return self.latest

    def set_status(self, status) -> None:  # pragma: no cover - no status in this test
        pass


def test_courier_never_claims_a_version_nobody_published():
    import time

    from elastic_tasks.rank.trainer import _Courier

    board = _RacingBoard()
    courier = _Courier(board)  # type: ignore[arg-type]
    courier.seen_version = 0
    courier.start()
    try:
        assert board.waiting.wait(5)
        board.latest = 1
        assert courier.refresh() == 1  # the rank learns of version 1 first...
        board.release.set()  # ...then the courier's long-poll for version 1 returns
        time.sleep(0.2)
        assert courier.seen_version == 1
    finally:
        courier.stop()


def test_lifecycle_final_states_are_final_and_moves_can_be_conditional():
    S = CoordinatorState
    life = Lifecycle()
    assert life.state is S.INIT
    assert life.move(S.STARTING) and life.move(S.RUNNING, only_from=(S.STARTING,))
    assert not life.move(S.RUNNING, only_from=(S.RESCALING,))  # a recovery already brought it back
    assert not life.move(S.RUNNING)  # already there: no repeated entry in the history
    assert life.move(S.STOPPED) and life.move(S.SUCCEEDED)  # its last step ended as the stop went out
    assert not life.move(S.FAILED) and not life.move(S.RUNNING)
    assert life.history == (S.INIT, S.STARTING, S.RUNNING, S.STOPPED, S.SUCCEEDED)
