"""Seed 002 (Elan) E-FIFO: FIFO admission plus Elan's elastic allocation rule.

What the paper says (Section VI-C): a submitted job *can start if its min_res is less than
the current free GPUs, or if adding it will not increase the average job completion time*;
among running jobs, *allocate min_res to each, then repeatedly add one worker to the job
with the maximum marginal gain* (Optimus's definition), stopping when GPUs run out, every
job is at max_res, or no gain is positive. Batch size and learning rate follow hybrid
scaling. E-FIFO applies this to a FIFO queue: the head blocks those behind it.

What we do, where the paper leaves it open:

* min_res / max_res are the fewest / most GPUs the job's batch range, memory cap and
  ``min_gpus``/``max_gpus`` allow; non-elastic jobs get exactly ``requested_gpus`` with their
  fixed batch and never grow. Batch on k GPUs is b_opt(k) from ``rate_table`` (hybrid scaling).
* Marginal gain (Optimus): the drop in the job's remaining time per added GPU,
  ``remaining * (1/R(k) - 1/R(k+1))``. Jobs with more work left gain more; a job whose
  throughput stops rising gains nothing and stops growing. Ties: earlier job first.
* A job starts when its minimum fits beside the running jobs' minimums (they shrink towards
  min_res to make room). The paper's second clause, "adding the job will not increase the
  average JCT", is available as ``jct_rule=True``: "free GPUs" are then the GPUs idle in
  the current allocation, and a job that does not fit in them starts only if a one-step
  estimate says the summed completion times do not rise (starting now delays the others
  by the GPUs it takes; waiting delays it until the first running job finishes; times are
  remaining samples over the modelled throughput). It is off by default because, measured
  in our simulator, it made queueing delay and average JCT *worse* (docs/policies.md): the
  estimate ignores the jobs queued behind a waiting head and the re-allocation interval.
* In DROP mode there is no queue to wait in, so a job is admitted whenever the minimums fit
  (dropping a job that could run would surprise a user); the JCT clause only decides
  waiting. ``allocate`` itself gives every job it is shown a share, as every policy must.

Admission is exposed as ``admit(snapshot, mode)``; the loop's ``allocator.admission`` uses
it when a policy provides one (otherwise the generic min-GPU test with ``strict_fifo``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from allocator.policies.base import SupportsMinGpus, register
from allocator.policies.elastic_dp import fewest_gpus
from allocator.policies.greedy import Gain, Tables, build_tables, finish_times, grow, to_allocation
from allocator.protocols import AdmissionDecision, OverflowMode
from allocator.types import Allocation, ClusterSnapshot, JobSpec



def marginal_gain(t: Tables, remaining: Sequence[float]) -> Gain:
    """Optimus's marginal gain: seconds of remaining time saved per added GPU."""

    def gain(i: int, k: int, k2: int) -> float:
        return remaining[i] * (1.0 / t.rate(i, k) - 1.0 / t.rate(i, k2)) / (k2 - k)

    return gain


def elan_counts(jobs: Sequence[JobSpec], remaining: Sequence[float], capacity: int) -> tuple[Tables, list[int]]:
    """Elan's allocation rule: min_res each, then one GPU at a time to the largest positive gain."""
    t = build_tables(jobs, capacity)
    return t, grow(t, capacity, marginal_gain(t, remaining), bar=0.0)


def remaining_of(snapshot: ClusterSnapshot) -> dict[str, float]:
    out = {r.spec.id: r.remaining_samples for r in snapshot.running}
    out.update({j.id: float(j.total_samples) for j in snapshot.queued})
    return out


@dataclass(slots=True)
class Admitting:
    """One admission pass's working state: who is in, their remaining work, GPUs spoken for."""

    snapshot: ClusterSnapshot
    policy: SupportsMinGpus
    jct_rule: bool = False
    accepted: list[JobSpec] = field(default_factory=list)
    remaining: list[float] = field(default_factory=list)
    need: int = 0
    idle: int = 0

    @classmethod
    def start(cls, snapshot: ClusterSnapshot, policy: SupportsMinGpus, jct_rule: bool) -> Admitting:
        state = cls(snapshot, policy, jct_rule, idle=snapshot.free_gpus)
        for r in snapshot.running:
            state.accepted.append(r.spec)
            state.remaining.append(r.remaining_samples)
            state.need += policy.min_gpus(r.spec, snapshot.capacity) or snapshot.capacity + 1
        return state

    def minimum(self, job: JobSpec) -> int | None:
        return self.policy.min_gpus(job, self.snapshot.capacity)

    def fits(self, job: JobSpec) -> bool:
        need = self.minimum(job)
        return need is not None and self.need + need <= self.snapshot.capacity

    def worth_starting(self, job: JobSpec) -> bool:
        """The paper's start condition, given that the minimums fit."""
        need = self.minimum(job)
        if need is None:
            return False
        if not self.jct_rule or need <= self.idle or not self.accepted:
            return True
        return not raises_average_jct(self.accepted, self.remaining, job, self.snapshot.capacity)

    def take(self, job: JobSpec) -> None:
        need = self.minimum(job) or 0
        self.accepted.append(job)
        self.remaining.append(float(job.total_samples))
        self.need += need
        self.idle = max(0, self.idle - need)

    def predicted_finishes(self) -> list[tuple[float, int]]:
        """(seconds to finish, min GPUs) for each accepted job under the allocation rule."""
        t, counts = elan_counts(self.accepted, self.remaining, self.snapshot.capacity)
        return [(float(f), int(m or 0)) for f, m in zip(finish_times(t, counts, self.remaining), t.minimum)]


def raises_average_jct(accepted: Sequence[JobSpec], remaining: Sequence[float], job: JobSpec, capacity: int) -> bool:
    """Would starting ``job`` now raise the summed completion times, against waiting for the first finish?

    Arrival times are the same in both cases, so comparing summed finish times compares
    average JCTs. The newcomer runs at the rate it would get now in both cases.
    """
    t_wait, counts_wait = elan_counts(accepted, remaining, capacity)
    finish_wait = finish_times(t_wait, counts_wait, remaining)
    everyone = [*accepted, job]
    left = [*remaining, float(job.total_samples)]
    t_now, counts_now = elan_counts(everyone, left, capacity)
    finish_now = finish_times(t_now, counts_now, left)
    starts_later_by = float(finish_wait.min())
    return float(finish_now.sum()) > float(finish_wait.sum()) + starts_later_by + float(finish_now[-1])


def decision(admitted: list[JobSpec], waiting: list[JobSpec], dropped: list[JobSpec]) -> AdmissionDecision:
    return AdmissionDecision(tuple(admitted), tuple(waiting), tuple(dropped))


def is_drop(mode: OverflowMode) -> bool:
    return mode == OverflowMode.DROP  # a str Enum: a plain 'drop' counts too


@dataclass(frozen=True, slots=True)
class ElanFifo:
    jct_rule: bool = False
    name: str = "elan_fifo"

    def allocate(self, snapshot: ClusterSnapshot) -> Allocation:
        jobs = snapshot.jobs
        if not jobs:
            return Allocation()
        left = remaining_of(snapshot)
        t, counts = elan_counts(jobs, [left[j.id] for j in jobs], snapshot.capacity)
        return to_allocation(t, counts)

    def min_gpus(self, job: JobSpec, capacity: int) -> int | None:
        return fewest_gpus(job, capacity, None)

    def admit(self, snapshot: ClusterSnapshot, mode: OverflowMode) -> AdmissionDecision:
        """FIFO: queued jobs start in arrival order; the first that cannot start blocks the rest."""
        state = Admitting.start(snapshot, self, self.jct_rule)
        admitted: list[JobSpec] = []
        waiting: list[JobSpec] = []
        dropped: list[JobSpec] = []
        drop = is_drop(mode)
        for job in snapshot.queued:
            if not waiting and state.fits(job) and (drop or state.worth_starting(job)):
                state.take(job)
                admitted.append(job)
            elif drop:
                dropped.append(job)
            else:
                waiting.append(job)
        return decision(admitted, waiting, dropped)


def parse_flag(name: str, value: object) -> bool:
    """A boolean policy parameter, also from CLI strings (true/false, 1/0, yes/no)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: must be true or false")


def check_params(policy: str, params: dict[str, object]) -> None:
    if params:
        raise ValueError(f"policy {policy} takes only jct_rule, got {sorted(params)}")


@register("elan_fifo")
def _make(jct_rule: object = False, **params: object) -> ElanFifo:
    check_params("elan_fifo", params)
    return ElanFifo(jct_rule=parse_flag("jct_rule", jct_rule))
