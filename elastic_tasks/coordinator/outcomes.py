"""What a job's coordinator reports: each generation change, the job's result, and its failure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from distributed import Client

from elastic_tasks.protocol import EvalResult, PlanKind, RankResult, StepRecord
from elastic_tasks.coordinator.recovery import RecoveryRecord


def occupancy(client: Client, workers: list[str]) -> str:
    """What each worker is running now, for an error that says why a rank never started."""
    try:
        busy = client.processing(workers)
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not hide the real error
        return f"worker occupancy unknown ({type(exc).__name__})"
    return "running on those workers: " + ", ".join(f"{w}: {list(busy.get(w, ())) or 'nothing'}" for w in workers)


class JobFailed(RuntimeError):
    """The job cannot go on (a rank raised, nobody survived and no checkpoint exists, ...)."""


@dataclass(frozen=True, slots=True)
class RescaleOutcome:
    """One generation change as the coordinator saw it; ``pause_s`` is measured by the ranks."""

    version: int
    kind: PlanKind
    before: int
    after: int
    global_batch: int
    step: int
    pause_s: float | None  # training time lost: last step of the old generation -> new one ready; None: it never trained
    prepare_s: float  # new ranks' start-up, overlapped with training (not lost)
    restart: bool = False


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job's outcome. ``history`` is the public per-step record (``StepRecord``: loss, the
    LR of each parameter group, GPUs, global batch, wall time), one per step in step order;
    ``evals`` the periodic evaluations in step order, the final one in ``eval_*``."""

    job_id: str
    finished: bool
    steps: int
    samples_seen: int
    history: tuple[StepRecord, ...]
    rescales: tuple[RescaleOutcome, ...]
    recoveries: tuple[RecoveryRecord, ...]
    stragglers: tuple[tuple[int, str], ...]
    ranks: tuple[RankResult, ...]
    eval_loss: float | None
    eval_accuracy: float | None
    eval_metrics: tuple[tuple[str, float], ...] = ()  # the recipe's own eval metrics (name, value)
    evals: tuple[EvalResult, ...] = ()  # periodic evaluations (recipe.eval_every / eval_every_s)

    @property
    def final_loss(self) -> float | None:
        return self.history[-1].loss if self.history else None


def gather(
    job_id: str,
    finished: bool,
    results: list[RankResult],
    rescales: Iterable[RescaleOutcome],
    recoveries: Iterable[RecoveryRecord],
    stragglers: Iterable[tuple[int, str]],
    fenced: frozenset[str] = frozenset(),
) -> JobResult:
    """One job's result from its ranks' results: a step's record comes from the rank that got
    furthest, an agreed record before one rank's own view of a step whose group failed. The
    results of ``fenced`` ranks (declared lost) are left out: nothing of theirs reaches the
    job's records or MLflow, whatever they trained after they were cut off."""
    results = [r for r in results if r.uid not in fenced]
    history: dict[int, StepRecord] = {}
    for r in sorted(results, key=lambda r: r.step):
        for rec in r.history:
            held = history.get(rec.step)
            if held is None or rec.loss_samples is None or held.loss_samples is not None:
                history[rec.step] = rec
    final = next((r for r in results if r.eval is not None), None)
    best = max(results, key=lambda r: r.step, default=None)
    return JobResult(
        job_id=job_id,
        finished=finished,
        steps=best.step if best else 0,
        samples_seen=best.samples_seen if best else 0,
        history=tuple(history[k] for k in sorted(history)),
        rescales=tuple(rescales),
        recoveries=tuple(recoveries),
        stragglers=tuple(stragglers),
        ranks=tuple(results),
        eval_loss=final.eval.loss if final and final.eval else None,
        eval_accuracy=final.eval.accuracy if final and final.eval else None,
        eval_metrics=final.eval.metrics if final and final.eval else (),
        evals=_evals(results),
    )


def _evals(results: Iterable[RankResult]) -> tuple[EvalResult, ...]:
    """Each periodic evaluation once (rank 0's, or every rank's when sharded), by step."""
    by_step = {e.step: e for r in results for e in r.evals}
    return tuple(by_step[k] for k in sorted(by_step, key=lambda s: -1 if s is None else s))
