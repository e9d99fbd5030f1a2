"""Two planes, two timeouts: a rank blocked in a data-plane collective is freed by the control plane.

gloo and nccl fail differently when a peer dies. gloo raises in the survivors' next
collective ("Connection closed by peer"). nccl does not: the survivors block inside the
gradient allreduce until the process group's timeout, and torch's default error handling
(``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``, tear down) then kills the whole process, so the
rank never reaches recovery (pytorch/elastic #134). So:

* **Data plane** (gradient allreduce, state broadcast): the process group, with a long
  timeout (``TrainConfig.data_timeout_s``) — a slow first step, a large broadcast or a peer
  writing a checkpoint is not a failure.
* **Control plane** (rendezvous, plans, the word that a peer is lost): the Dask scheduler and
  the TCP store, with a short timeout (``TrainConfig.timeout_s``). The coordinator sees a
  member's worker or task die and says so on the job board (``JobBoard.abort_generation``).
* ``HangWatch``, a thread per rank, watches the rank's current data-plane region: once the
  board says its generation lost a member, or the region outlives ``data_timeout_s``, it
  *aborts* the communicators (``_abort_process_group``: local, never a collective destroy,
  which would itself hang on the dead peer). The blocked collective then raises in the
  survivor, which goes through the same ``CollectiveFailure`` → recovery → shrink in place
  as on gloo.
* After an abort torch has forgotten the group (``_abort_process_group`` unregisters every
  group of the process): the next call into it raises whatever torch raises there — a
  ``ValueError`` ("Default process group has not been initialized") from the agreement (DDP
  still holds the aborted group: its hook refuses to call into it, ``HookWitness``). So the
  watch records *which generation* it aborted, and a data-plane region of that generation ends in
  ``CollectiveFailure`` whatever came out of it (or nothing: on nccl the host sync that the
  kernel held returns once the communicator is aborted, with whatever the buffers held). The
  rank then drops the aborted group without a collective destroy and forms the next
  generation's group afresh.
* nccl's own watchdog is left out of it: ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``
  (``configure_nccl_error_mode``), as torch documents for ``_abort_process_group``. The watch
  owns both ways a region ends in an abort: the control plane's word and the data-plane
  timeout.

gloo cannot abort a collective in flight (measured with torch 2.13: ``_abort_process_group``
returns, the allreduce stays blocked until the peer's socket closes or gloo's timeout). So every
data-plane wait of the rank waits on a future the watch can fail (``abandon.py``): when the watch
fires, the waits in flight raise ``CollectiveFailure`` on gloo as on nccl. The abort itself is
the same call on both backends: it takes the group away, so every later call into it fails at
once, and CPU tests go through the very path a GPU rank takes. To test nccl's semantics on CPU,
``MALLEABLE_SIMULATE_NCCL_HANG=1`` in a rank's environment makes a failed collective *hang*
in the survivor, as nccl's would, until the watch aborts it: the survivors must then be freed
by the control plane within its timeout, and the job must still shrink in place.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from elastic_tasks.rank.health.abandon import DataPlaneWaits
from elastic_tasks.rank.health.collective import CollectiveFailure

# nccl's watchdog on a failed or timed-out collective. torch 2.13 documents (docs:
# torch_nccl_environment_variables; ProcessGroupNCCL.hpp, ErrorHandlingMode): 0 no handling,
# 1 abort the communicators and tear the process down, 2 abort the communicators only ("clean up
# only"), 3 tear down without aborting — the default. Teardown (1, 3) kills the Dask worker, so
# the survivor never reaches recovery. And ``_abort_process_group``'s docstring: "this API
# should be used with TORCH_NCCL_ASYNC_ERROR_HANDLING turned off (i.e. set to 0). Otherwise,
# ProcessGroupNCCL's watchdog may automatically handle errors or timeouts for you including
# aborting the ProcessGroup" (torch's own abort test, test_close_pg, sets 0 for that reason).
# So 0: the HangWatch is the only one that aborts, on the control plane's word or once a
# data-plane region outlives data_timeout_s (the group's own timeout, which the watchdog then
# only reports) — every data-plane call runs inside such a region.
NCCL_ERROR_ENV = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
# Fault injection (tests, the CPU half of gpu_validation): a failed collective hangs like nccl's.
SIMULATE_HANG_ENV = "MALLEABLE_SIMULATE_NCCL_HANG"
# How often the watch looks at the region in progress: the detection delay it adds.
POLL_S = 0.2
# A region younger than this is not asked about on the board: most steps end first, and the
# board is a round trip to the scheduler (through the worker's event loop, shared with the
# rank's own traffic). Far below any control-plane timeout.
SUSPECT_AFTER_S = 1.0
# The board is asked at most this often per rank while a region lasts (3 ranks on a loaded
# 2-core box made the scheduler busier at 5 requests per second each).
ASK_EVERY_S = 1.0


def configure_nccl_error_mode(backend: str) -> None:
    """Before an nccl group exists (ProcessGroupNCCL reads the variable when it is built): the
    watchdog neither aborts nor kills the process; the HangWatch aborts. A value the operator
    set is kept (documented in docs/elastic.md)."""
    if backend == "nccl":
        os.environ.setdefault(*NCCL_ERROR_ENV)


def simulate_hang_requested() -> bool:
    return os.environ.get(SIMULATE_HANG_ENV, "") == "1"


def abort_communicators() -> None:
    """Abort every group of this process locally (nccl: ``ncclCommAbort``) and unregister them;
    never collective, so it cannot wait on a dead peer."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.distributed_c10d._abort_process_group()


class HangWatch:
    """Frees a rank from a data-plane collective that will never complete.

    ``lost_generation`` is the control plane's answer to "which generation lost a member"
    (``JobBoard.aborted_generation``); ``abort`` what aborting does (``abort_communicators``).
    """

    def __init__(
        self,
        lost_generation: Callable[[], int],
        data_timeout_s: float,
        *,
        abort: Callable[[], None] = abort_communicators,
        simulate_hang: bool = False,
        poll_s: float = POLL_S,
    ) -> None:
        self.lost_generation = lost_generation
        self.data_timeout_s = data_timeout_s
        self.simulate_hang = simulate_hang
        self.poll_s = poll_s
        self.reason = ""
        self.aborts: list[tuple[int, str, float]] = []  # (generation, why, seconds into the region)
        self._aborted_versions: set[int] = set()  # generations whose group this watch aborted
        self._abort = abort
        self._aborted = threading.Event()
        self._fired = False  # mirrors ``_aborted``, both changed under ``_lock``
        self._lock = threading.Lock()  # the region and the abort: a group is never aborted after it was dropped
        self._region: tuple[int, float, str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="malleable-hang-watch")
        self.waits = DataPlaneWaits()  # the data-plane waits in flight, failed when the watch fires
        self.failed_region_s = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def aborted(self, version: int) -> bool:
        """Whether this watch aborted generation ``version``'s group: then nothing may touch it
        again (no collective destroy), and the next generation forms afresh.

        Without the lock: DDP's hook asks, and ``_fire`` completes futures (whose callbacks may
        ask) while it holds the lock; a set's membership is read atomically."""
        return version in self._aborted_versions

    def take_failed_region_s(self) -> float:
        """How long the last failed region had blocked the rank (0: none since the last call); the
        rank's recovery report carries it (board.RankEvent.blocked_s)."""
        value, self.failed_region_s = self.failed_region_s, 0.0
        return value

    def data_plane(self, version: int, what: str) -> _DataPlane:
        """Around data-plane collectives of generation ``version``.

        Once the watch aborted this generation's group, the region ends in ``CollectiveFailure``
        whatever it raised, or if it raised nothing (see the module docstring)."""
        return _DataPlane(self, version, what)

    def _enter(self, version: int, what: str) -> float:
        """Start the region; when (monotonic)."""
        t0 = time.monotonic()
        with self._lock:
            if self._fired:  # ``_aborted`` is set, only under this lock (``_fire``): no race; Event.clear takes a second lock
                self._aborted.clear()
                self._fired = False
            self.reason = ""
            self._region = (version, t0, what)
        self.waits.enter(version)
        return t0

    def _leave(self, version: int) -> bool:
        """End the region; whether its generation was aborted (once the region is gone, it cannot be)."""
        with self._lock:
            self._region = None
            return version in self._aborted_versions

    def _run(self) -> None:
        last_asked = 0.0
        while not self._stop.wait(self.poll_s):
            with self._lock:
                region = self._region
            if region is None or self._aborted.is_set():
                continue
            version, t0, what = region
            age = time.monotonic() - t0
            if age >= self.data_timeout_s:
                self._fire(region, f"{what} outlived the data-plane timeout ({self.data_timeout_s:g} s)")
            elif age >= SUSPECT_AFTER_S and time.monotonic() - last_asked >= ASK_EVERY_S:
                last_asked = time.monotonic()
                try:
                    lost = self.lost_generation()
                except Exception:  # noqa: BLE001 - the scheduler is briefly unreachable: ask again next poll
                    continue
                if lost >= version:
                    self._fire(region, f"the control plane declared a member of generation {version} lost")

    def _fire(self, region: tuple[int, float, str], reason: str) -> None:
        with self._lock:
            if self._region is not region:  # the rank left the region meanwhile: nothing to free
                return
            self.reason = reason
            self.aborts.append((region[0], reason, time.monotonic() - region[1]))
            self._aborted_versions.add(region[0])
            self._aborted.set()
            self._fired = True  # ``_aborted.is_set()`` without a Python call, for ``_enter`` (every step)
            self.waits.abandon(region[0], reason)
            self._abort()


class _DataPlane:
    """``HangWatch.data_plane``'s region: a class, not a generator (every step enters one); not
    re-entrant, but reusable: the trainer enters one object for every step of a generation."""

    __slots__ = ("_watch", "_version", "_what", "_t0")

    def __init__(self, watch: HangWatch, version: int, what: str) -> None:
        self._watch, self._version, self._what, self._t0 = watch, version, what, 0.0

    def __enter__(self) -> None:
        self._t0 = self._watch._enter(self._version, self._what)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        """Ends the region; a region that fails (its own error, or an abort found here) leaves how
        long it blocked in ``failed_region_s``."""
        if exc is None and not self._watch._leave(self._version):
            return False  # the usual step: nothing raised, nothing aborted
        try:
            self._exit(exc)
        except BaseException:
            self._watch.failed_region_s = time.monotonic() - self._t0
            raise
        if exc is not None:
            self._watch.failed_region_s = time.monotonic() - self._t0
        return False

    def _exit(self, exc: BaseException | None) -> None:
        watch, version = self._watch, self._version
        if exc is None:  # ``__exit__`` left the region and found its generation aborted meanwhile
            raise CollectiveFailure(f"{self._what}: communicator aborted: {watch.reason}")
        if isinstance(exc, CollectiveFailure):
            if watch.simulate_hang:
                # nccl's survivors would sit in the collective; so do we, until aborted (the
                # watch bounds it by the data-plane timeout even without the control plane).
                watch._aborted.wait(watch.data_timeout_s + watch.poll_s * 5)
            if watch._leave(version):
                raise CollectiveFailure(f"{exc}; communicator aborted: {watch.reason}") from exc
            return
        if isinstance(exc, Exception) and watch._leave(version):  # the aborted group's own error, whichever call met it first
            raise CollectiveFailure(f"{self._what}: {type(exc).__name__}: {exc}; communicator aborted: {watch.reason}") from exc
        watch._leave(version)
