"""``malleable train``'s MLflow run: opened before the job starts, each periodic evaluation
logged as it arrives, the per-step curve (metrics, a CSV and a PNG) when the job ends."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from elastic_tasks.coordinator.outcomes import JobResult
from elastic_tasks.protocol import EvalResult
from flows.recording.step_curve import eval_points, history_points, plot_step_curve, write_history_csv
from flows.recording.tracking import MetricPoint, Tracker


class TrainRun:
    def __init__(self, tracker: Tracker, name: str, params: Mapping[str, object]) -> None:
        self._tracker = tracker
        self._name = name
        self.run = tracker.start_run(f"train {name}", params=params, tags={"malleable.mode": "train"})
        self._live_steps: set[int | None] = set()

    def live_eval(self, result: EvalResult) -> None:
        """A periodic evaluation, logged while the job trains (called from the progress thread)."""
        self._tracker.log_metrics(self.run, eval_points(result))
        self._live_steps.add(result.step)

    def finish(self, result: JobResult) -> None:
        late = [e for e in result.evals if e.step not in self._live_steps]
        points = history_points(result.history, late)
        final = EvalResult(result.eval_loss, result.eval_accuracy, 0, result.eval_metrics, result.steps)
        if result.eval_loss is not None or result.eval_metrics:
            points += [MetricPoint(f"final_{p.key}", p.value, p.step) for p in eval_points(final)]
        self._tracker.log_metrics(self.run, points)
        with tempfile.TemporaryDirectory() as tmp:
            if result.history:
                png = plot_step_curve(result.history, result.evals, f"{self._name}: loss and learning rate per step", Path(tmp) / "step_curve.png")
                self._tracker.log_figure_file(self.run, png)
                self._tracker.log_artifact(self.run, write_history_csv(result.history, Path(tmp) / "step_history.csv"))
        self._tracker.end_run(self.run, "FINISHED" if result.finished else "FAILED")

    def fail(self) -> None:
        self._tracker.end_run(self.run, "FAILED")
