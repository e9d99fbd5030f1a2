"""What a rank tells as it trains: each switch and each agreed step go into its records;
stragglers and rank 0's status go onto the job board.

Every rank keeps the same records (they come back in its ``RankResult``); only rank 0 speaks for
the job on the board, so the coordinator hears each event once.
"""

from __future__ import annotations

import time

from elastic_tasks.board import EventKind, JobBoard, JobStatus, RankEvent
from elastic_tasks.protocol import Plan, SwitchRecord
from elastic_tasks.rank.agreement import Agreed
from elastic_tasks.rank.plan_watcher import Courier
from elastic_tasks.rank.accounting.records import RankRecords
from elastic_tasks.rank.state.elastic import TrainMeta
from elastic_tasks.rank.health.straggler import StragglerDetector

RECENT_EVALS = 8  # periodic evaluations carried in rank 0's status (JobStatus.recent_evals)


class RankReporter:
    """Writes a rank's records as it switches and steps; rank 0 also posts to the board."""

    def __init__(self, uid: str, board: JobBoard, courier: Courier, records: RankRecords, detector: StragglerDetector) -> None:
        self.uid = uid
        self.board = board
        self.courier = courier  # pushes rank 0's status in the background
        self.records = records
        self.detector = detector

    def switched(self, plan: Plan, meta: TrainMeta, rank: int, world: int, pause: float, source: str | None) -> None:
        """``plan`` took effect at ``meta.step`` after a pause of ``pause`` seconds."""
        self.records.switches.append(SwitchRecord(plan.version, plan.kind, meta.step, world, meta.global_batch, pause, source))
        self.records.step_times.clear()
        if rank == 0:
            self.board.post(RankEvent(EventKind.APPLIED, self.uid, plan.version, meta.step, pause_s=pause, world_size=world))

    def stepped(self, agreed: Agreed | None, plan: Plan | None, meta: TrainMeta, rank: int, world: int, accum: int = 1) -> None:
        """Keep a read agreement's step record; flag stragglers; rank 0 reports status."""
        if agreed is None or plan is None:
            return
        record = agreed.record
        self.records.history.append(record)
        if record.loss_samples is not None:  # one rank's view of a step whose group failed
            return
        self.records.step_times.append(record.wall_s)
        # Stragglers are ranks slower than the others: a world of one has none (and nothing to update).
        for uid in self.detector.update(dict(zip(plan.members, agreed.throughput, strict=True))) if world > 1 else ():
            self.records.stragglers.append((record.step, uid))
            if rank == 0:
                self.board.post(RankEvent(EventKind.STRAGGLER, uid, plan.version, record.step))
        if rank == 0:
            evals, n_evals, now, uid = self.records.evals, len(self.records.evals), time.time(), self.uid
            # Built only if the courier pushes it (``Courier.offer``): from values fixed now.
            self.courier.offer(lambda: JobStatus(
                plan.version, meta.step, meta.samples_seen, world, meta.global_batch, record.loss, now, record.noise_scale,
                lr=record.lr, recent_evals=tuple(evals[max(0, n_evals - RECENT_EVALS) : n_evals]), accum_steps=accum, writer=uid,
            ))
