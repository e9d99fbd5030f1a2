"""Issue 22.1: nccl's failure semantics on CPU — a collective that *hangs* when a peer dies.

``HangWatch`` holds a failed collective in the survivor (``MALLEABLE_SIMULATE_NCCL_HANG``)
as nccl would, until the control plane says the generation lost a member, or the data-plane
timeout passes; then it aborts the communicator and the survivor goes to recovery.
"""

import threading

import pytest

from elastic_tasks.protocol import TrainConfig
from elastic_tasks.rank.health.collective import CollectiveFailure
from elastic_tasks.rank.health.hang_watch import NCCL_ERROR_ENV, HangWatch, configure_nccl_error_mode

GENEROUS_HANG_BOUND_S = 60.0  # only a bound on a hang of the test itself


class Board:
    """The control plane's answer, flipped by the test (the coordinator's JobBoard in production)."""

    def __init__(self) -> None:
        self.lost = -1
        self.asked = threading.Event()

    def lost_generation(self) -> int:
        self.asked.set()
        return self.lost


def _survivor(watch, version, outcome):
    try:
        with watch.data_plane(version, "step 7"):
            raise CollectiveFailure("step 7: RuntimeError: Connection closed by peer")
    except CollectiveFailure as exc:
        outcome.append(exc)


def test_a_failed_collective_hangs_until_the_control_plane_declares_the_peer_lost():
    board, aborted = Board(), []
    watch = HangWatch(board.lost_generation, data_timeout_s=3600.0, abort=lambda: aborted.append(True), simulate_hang=True, poll_s=0.02)
    watch.start()
    outcome = []
    survivor = threading.Thread(target=_survivor, args=(watch, 4, outcome))
    survivor.start()
    try:
        assert board.asked.wait(GENEROUS_HANG_BOUND_S)  # the watch is asking, the survivor still blocked
        board.lost = 3  # an older generation's loss frees nobody here
        board.asked.clear()
        assert board.asked.wait(GENEROUS_HANG_BOUND_S)
        survivor.join(0.2)
        assert survivor.is_alive() and not outcome and not aborted  # hanging, as on nccl
        board.lost = 4
        survivor.join(GENEROUS_HANG_BOUND_S)
    finally:
        watch.stop()
    assert not survivor.is_alive()
    [exc] = outcome
    assert "communicator aborted: the control plane declared a member of generation 4 lost" in str(exc)
    assert aborted == [True] and [a[0] for a in watch.aborts] == [4]


def test_without_the_control_plane_the_data_timeout_bounds_the_hang():
    board, aborted = Board(), []
    watch = HangWatch(board.lost_generation, data_timeout_s=1.0, abort=lambda: aborted.append(True), simulate_hang=True, poll_s=0.02)
    watch.start()
    outcome = []
    try:
        _survivor(watch, 2, outcome)
    finally:
        watch.stop()
    [exc] = outcome
    assert "outlived the data-plane timeout (1 s)" in str(exc) and aborted == [True]
    assert watch.aborts[0][2] >= 1.0  # fired once the region was a data timeout old, not before


def test_gloo_semantics_unchanged_without_simulation():
    # Not simulating: the failure raises at once, nothing is aborted (gloo raised by itself).
    board, aborted = Board(), []
    watch = HangWatch(board.lost_generation, data_timeout_s=3600.0, abort=lambda: aborted.append(True), poll_s=0.02)
    watch.start()
    outcome = []
    try:
        _survivor(watch, 1, outcome)
    finally:
        watch.stop()
    [exc] = outcome
    assert "aborted" not in str(exc) and not aborted


def test_a_region_left_in_time_is_never_aborted():
    board, aborted = Board(), []
    board.lost = 9
    watch = HangWatch(board.lost_generation, data_timeout_s=3600.0, abort=lambda: aborted.append(True), simulate_hang=True, poll_s=0.02)
    with watch.data_plane(9, "step 1"):
        pass  # the region ended before the watch ever ran: its group may be gone already
    watch.start()
    watch.stop()
    assert not aborted


def test_nccl_error_mode_is_set_explicitly_and_an_operator_value_kept(monkeypatch):
    name, value = NCCL_ERROR_ENV
    monkeypatch.delenv(name, raising=False)
    configure_nccl_error_mode("gloo")
    import os

    assert name not in os.environ
    configure_nccl_error_mode("nccl")
    assert os.environ[name] == value == "0"  # no handling: the watch aborts (torch documents the abort for 0), nothing tears the process down
    monkeypatch.setenv(name, "3")
    configure_nccl_error_mode("nccl")
    assert os.environ[name] == "3"


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_data_timeout_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError, match=r"TrainConfig.data_timeout_s="):
        TrainConfig(global_batch=8, max_steps=1, data_timeout_s=bad)
