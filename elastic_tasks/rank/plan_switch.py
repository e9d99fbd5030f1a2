"""Which plan a rank trains under, which one it switches to, and at which step boundary.

The courier thread (``plan_watcher.py``) only learns plan *versions*; the ranks agree at the end
of every step on the newest version any of them has seen (``agreement.py``). Reading the plan
behind that version and deciding when it takes effect happens here, the same way on every rank
from the same agreed version, so all ranks switch at the same step. A rank whose generation
failed also waits here, for the coordinator's recovery plan.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from datetime import timedelta

import torch.distributed as dist

from elastic_tasks.board import JobBoard
from elastic_tasks.coordinator.timeouts import RECOVERY_POLL_S, plan_wait_s
from elastic_tasks.protocol import Plan, PlanKind, TrainConfig
from elastic_tasks.rank.host_share import HostShare
from elastic_tasks.rank.plan_watcher import Courier
from elastic_tasks.rank.accounting.wall_split import Phase, WallTimeline


class PlanSwitch:
    """The plan in effect and the next one read but not yet due (its ``at_step`` still ahead)."""

    def __init__(self, board: JobBoard, config: TrainConfig, wall: WallTimeline, share: HostShare | None = None) -> None:
        self.board = board
        self.share = share  # the host's copies of plans, left there by its leader (host_share.py)
        self.config = config
        self.wall = wall
        self.current: Plan | None = None
        self.pending: Plan | None = None
        # The generation's TCPStore (hosted by its rank 0) and this rank's index in it: see ``_read``.
        self._store: dist.Store | None = None
        self._rank = 0

    def fan_out_through(self, store: dist.Store | None, rank: int) -> None:
        """From now on, plans due at a step boundary come through ``store`` (the generation's own)."""
        self._store, self._rank = store, rank

    def _read(self, version: int, timeout: float) -> Plan:
        """The plan behind an agreed version, read once from the scheduler per generation, not once per rank.

        Every rank reaches this at the same boundary with the same version (the agreement). N ranks
        each asking the scheduler cost 1,024 round trips at 1,024 ranks (p99 628 ms on the bench
        box, docs/elastic.md "Control plane at scale"); so rank 0 reads it there and puts it on the
        generation's TCPStore, which it hosts and every rank is already connected to, and the
        others take it from there. Should the store fail (rank 0's host gone), the board answers.
        Before either: the host's shared memory, where its leader left the plan as it was
        published (no round trip, no wait on rank 0; 1,024 ranks: host_share.py).
        """
        shared = self._shared(version)
        store = self._store
        if store is None:
            return shared if shared is not None else self.board.plan(version, timeout=timeout)
        key = f"malleable/plan/{version}"
        if self._rank == 0:  # the other hosts' ranks may not find it in their share: the store has it
            plan = shared if shared is not None else self.board.plan(version, timeout=timeout)
            with contextlib.suppress(Exception):
                store.set(key, pickle.dumps(plan))
            return plan
        if shared is not None:
            return shared
        try:
            if store.timeout != timedelta(seconds=timeout):  # get() alone waits the store's own timeout
                store.wait([key], timedelta(seconds=timeout))
            return pickle.loads(store.get(key))  # one round trip where the timeouts agree (the usual case)
        except Exception:  # noqa: BLE001 - the store's host is gone or silent: the board still has the plan
            return self.board.plan(version, timeout=timeout)

    def _shared(self, version: int) -> Plan | None:
        data = self.share.get(version) if self.share is not None else None
        if data is None:
            return None
        with contextlib.suppress(Exception):  # a torn copy: read it the usual way
            plan = pickle.loads(data)
            if isinstance(plan, Plan) and plan.version == version:
                return plan
        return None

    def adopt(self, plan: Plan) -> None:
        """``plan`` is in effect from now; nothing is pending."""
        self.current, self.pending = plan, None

    def due(self, newest: int, step: int) -> Plan | None:
        """The plan to switch to at this boundary: the newest any rank has seen, once its step has come."""
        plan = self.current
        assert plan is not None
        if newest == plan.version and self.pending is None and step in self.config.hold_at_steps:
            newest = plan.version + 1  # a declared switch step: every rank waits here for the next plan
            with self.wall.phase(Phase.REGROUP):
                candidate = self._read(newest, timeout=self.config.data_timeout_s)
        elif newest > plan.version and (self.pending is None or newest > self.pending.version):
            candidate = self._read(newest, timeout=self.config.timeout_s)
        else:
            candidate = None
        if candidate is not None:
            if candidate.kind != PlanKind.RECOVER:  # recovery plans are for ranks in recovery
                self.pending = candidate
        pending = self.pending
        if pending is not None and (pending.at_step is None or step >= pending.at_step):
            return pending
        return None

    def recovery(self, failed: int, uid: str, courier: Courier) -> Plan | None:
        """After generation ``failed`` lost a member: the coordinator's next recovery or stop plan
        (None when it leaves ``uid`` out, or when none comes within the plan wait)."""
        deadline = time.monotonic() + plan_wait_s(self.config)
        version = failed
        while time.monotonic() < deadline:
            latest = courier.refresh()
            while version < latest:
                version += 1
                plan = self.board.plan(version, timeout=self.config.timeout_s)
                if plan.kind in (PlanKind.RECOVER, PlanKind.STOP, PlanKind.CHECKPOINT_STOP):
                    return plan if uid in plan.members else None
            time.sleep(RECOVERY_POLL_S)
        return None
