"""Which plan a rank trains under, which one it switches to, and at which step boundary.

The courier thread (``plan_watcher.py``) only learns plan *versions*; the ranks agree at the end
of every step on the newest version any of them has seen (``agreement.py``). Reading the plan
behind that version and deciding when it takes effect happens here, the same way on every rank
from the same agreed version, so all ranks switch at the same step. A rank whose generation
failed also waits here, for the coordinator's recovery plan.
"""

from __future__ import annotations

import time

from elastic_tasks.board import JobBoard
from elastic_tasks.coordinator.timeouts import RECOVERY_POLL_S, plan_wait_s
from elastic_tasks.protocol import Plan, PlanKind, TrainConfig
from elastic_tasks.rank.plan_watcher import Courier
from elastic_tasks.rank.wall_split import Phase, WallTimeline


class PlanSwitch:
    """The plan in effect and the next one read but not yet due (its ``at_step`` still ahead)."""

    def __init__(self, board: JobBoard, config: TrainConfig, wall: WallTimeline) -> None:
        self.board = board
        self.config = config
        self.wall = wall
        self.current: Plan | None = None
        self.pending: Plan | None = None

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
                candidate = self.board.plan(newest, timeout=self.config.data_timeout_s)
        elif newest > plan.version and (self.pending is None or newest > self.pending.version):
            candidate = self.board.plan(newest, timeout=self.config.timeout_s)
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
