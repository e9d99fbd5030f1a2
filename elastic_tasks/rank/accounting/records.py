"""What a rank keeps of its life until it returns: the records its ``RankResult`` carries.

Kept apart from the rank loop so that the loop reads as training, and the result's shape
(tuples, the median step time of the last generation) is built in one place.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics

from elastic_tasks.protocol import EvalResult, RankExit, RankResult, SwitchRecord
from elastic_tasks.rank.state.elastic import TrainMeta
from elastic_tasks.rank.accounting.step_history import StepHistory

# The median step time is of the last steps of the last generation: a bounded window, so a
# long run keeps no per-step memory (issue 34) and the figure follows the current speed.
STEP_TIMES_KEPT = 128


@dataclasses.dataclass(slots=True)
class RankRecords:
    """Appended to as the rank trains; read once, by ``result``."""

    history: StepHistory = dataclasses.field(default_factory=StepHistory)  # streamed to a temporary file
    switches: list[SwitchRecord] = dataclasses.field(default_factory=list)
    indices: list[tuple[int, tuple[int, ...]]] = dataclasses.field(default_factory=list)  # (step, this rank's samples)
    stragglers: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (step, uid) when first flagged
    recoveries: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (failed generation, step held)
    step_times: collections.deque[float] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=STEP_TIMES_KEPT))  # current generation's last steps
    evals: list[EvalResult] = dataclasses.field(default_factory=list)  # periodic evaluations, in step order

    def result(self, uid: str, exit_: RankExit, meta: TrainMeta, evaluation: EvalResult | None = None) -> RankResult:
        return RankResult(
            uid=uid,
            exit=exit_,
            step=meta.step,
            samples_seen=meta.samples_seen,
            history=tuple(self.history),
            switches=tuple(self.switches),
            indices=tuple(self.indices),
            stragglers=tuple(self.stragglers),
            recoveries=tuple(self.recoveries),
            eval=evaluation,
            step_time_s=statistics.median(self.step_times) if self.step_times else 0.0,
            evals=tuple(self.evals),
        )
