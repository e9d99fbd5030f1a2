"""Types that cross between a job's coordinator (client side) and its ranks (Dask workers).

A *plan* tells the ranks of a job which members form the next generation, with what global
batch, from which step, and whose state everyone copies. Plans are numbered; each version
is published once and never changes, so every rank that reads version v reads the same plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from allocator.wall_split import PhaseInterval

# ``Plan.source`` value meaning: every member loads the last checkpoint from disk.
FROM_CHECKPOINT = "<checkpoint>"


class PlanKind(str, Enum):
    START = "start"
    RESCALE = "rescale"  # in place: survivors keep processes and tensors
    BATCH = "batch"  # same members, another global batch: applied at a step boundary, no regroup
    RECOVER = "recover"  # after a rank was lost: shrink to survivors
    STOP = "stop"  # every rank leaves (the job is paused or cancelled)
    CHECKPOINT_STOP = "checkpoint_stop"  # save a checkpoint, then every rank leaves (restart path)


class RankExit(str, Enum):
    FINISHED = "finished"
    LEFT = "left"  # not a member of the next generation
    STOPPED = "stopped"
    DUPLICATE = "duplicate"  # a re-run of a rank task that already ran: did nothing
    FENCED = "fenced"  # declared lost by the coordinator; its writes were refused, so it left


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """How one job trains; the same object goes to every rank.

    The job ends at ``max_steps`` or once ``total_samples`` have been processed, whichever
    comes first. ``max_batch_per_gpu`` is the memory cap that turns into gradient
    accumulation. Two planes, two timeouts (docs/elastic.md, "Two planes"): ``timeout_s``
    bounds the control plane — rendezvous, plans, agreement on a lost peer — and so how soon
    survivors stop waiting for a dead peer; ``data_timeout_s`` bounds one data-plane
    collective (the gradient allreduce, the state broadcast) that is merely slow: a slow first
    step (cuDNN autotune, ``torch.compile``), a large broadcast, a peer writing a checkpoint.
    """

    global_batch: int
    max_steps: int | None = None
    total_samples: int | None = None
    seed: int = 0
    max_batch_per_gpu: int | None = None
    lr_ramp_steps: int = 100
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    timeout_s: float = 30.0
    backend: str | None = None  # None: nccl where CUDA is available, else gloo
    torch_threads: int = 1
    record_indices: bool = False
    evaluate: bool = True
    straggler_alpha: float = 0.1
    straggler_threshold: float = 0.8
    noise_probe: bool = True  # measure the gradient noise scale (goodput_dp reads it); off only to measure its cost
    # The probe's average share of the step time at most (rank/noise/probe_schedule.py); None:
    # no bound (every step the variance asks for is sampled, whatever it costs). Off by default:
    # on a small model the thinned samples cost the estimate its accuracy (mlp_tiny: relative
    # error 0.4-0.6 against 0.04, docs/benchmarks.md). The placement failure once seen with it on
    # ("gpus=2: only 1 free GPU worker(s)") was most likely a grow failing its job, which now waits.
    noise_probe_budget: float | None = None
    data_timeout_s: float = 600.0
    # The plan wait (coordinator/timeouts.plan_wait_s): how long a rank waits for its first or its
    # recovery plan, and at a start's rendezvous for peers still starting. None: max(60 s,
    # 4 x timeout_s), for ranks that import torch on a loaded host. A small local cluster whose
    # ranks start in seconds can set it lower: a rank that never shows up is given up on sooner.
    plan_wait_s: float | None = None
    broadcast_chunk_mb: int = 256  # a state broadcast's staging buffer, at most (rank/state/chunked.py)
    hold_at_steps: frozenset[int] = frozenset()
    """Step boundaries a switch was declared for in advance (``malleable train --rescale-at``):
    there every rank waits (up to ``data_timeout_s``) for the coordinator's next plan rather than
    train past a step whose plan it has not read yet. A plan's ``at_step`` alone is a lower bound:
    ranks switch at the first boundary at or after it *once they have read it*, which on a fast
    step or a busy host is several steps late. Only steps the coordinator will publish a plan for."""

    def __post_init__(self) -> None:
        _int("global_batch", self.global_batch, 1)
        if self.max_steps is None and self.total_samples is None:
            raise ValueError("TrainConfig: set max_steps or total_samples (the job must end)")
        if self.max_steps is not None:
            _int("max_steps", self.max_steps, 1)
        if self.total_samples is not None:
            _int("total_samples", self.total_samples, 1)
        _int("seed", self.seed, 0)
        if self.max_batch_per_gpu is not None:
            _int("max_batch_per_gpu", self.max_batch_per_gpu, 1)
        _int("lr_ramp_steps", self.lr_ramp_steps, 0)
        _int("checkpoint_every", self.checkpoint_every, 0)
        if self.checkpoint_every and self.checkpoint_dir is None:
            raise ValueError(f"TrainConfig.checkpoint_every={self.checkpoint_every!r}: needs checkpoint_dir")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"TrainConfig.timeout_s={self.timeout_s!r}: must be a finite number > 0")
        if not (math.isfinite(self.data_timeout_s) and self.data_timeout_s > 0):
            raise ValueError(f"TrainConfig.data_timeout_s={self.data_timeout_s!r}: must be a finite number > 0")
        wait = self.plan_wait_s
        if wait is not None and not (isinstance(wait, (int, float)) and not isinstance(wait, bool) and math.isfinite(wait) and wait >= 2 * self.timeout_s):
            # A recovery plan comes after the failed collective's control timeout and the members'
            # reports (up to another control timeout): a shorter wait gives up on a plan on its way.
            raise ValueError(f"TrainConfig.plan_wait_s={wait!r}: must be a finite number >= 2 x timeout_s ({2 * self.timeout_s:g}) or None")
        _int("broadcast_chunk_mb", self.broadcast_chunk_mb, 1)
        budget = self.noise_probe_budget
        if budget is not None and not (isinstance(budget, (int, float)) and not isinstance(budget, bool) and 0 < budget <= 1):
            raise ValueError(f"TrainConfig.noise_probe_budget={budget!r}: must be a number in (0, 1] or None")
        if not isinstance(self.hold_at_steps, frozenset):
            raise ValueError(f"TrainConfig.hold_at_steps={self.hold_at_steps!r}: must be a frozenset of steps >= 1")
        for step in sorted(self.hold_at_steps):
            _int("hold_at_steps", step, 1)
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"TrainConfig.backend={self.backend!r}: expected 'gloo', 'nccl' or None")
        _int("torch_threads", self.torch_threads, 1)
        if not (0 < self.straggler_alpha <= 1):
            raise ValueError(f"TrainConfig.straggler_alpha={self.straggler_alpha!r}: must be in (0, 1]")
        if not (0 <= self.straggler_threshold <= 1):
            raise ValueError(f"TrainConfig.straggler_threshold={self.straggler_threshold!r}: must be in [0, 1]")


def _int(name: str, value: object, minimum: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
        raise ValueError(f"TrainConfig.{name}={value!r}: must be an integer >= {minimum}")


@dataclass(frozen=True, slots=True)
class Plan:
    """Generation ``version`` of a job: ``members`` in rank order (rank 0 hosts the rendezvous).

    Running ranks switch at the first step boundary >= ``at_step`` (None: as soon as all have
    seen the plan). ``source`` is the member whose state every other member copies (None:
    members already agree, e.g. after a scale-in; FROM_CHECKPOINT: load from disk).
    """

    version: int
    kind: PlanKind
    members: tuple[str, ...]
    global_batch: int
    at_step: int | None = None
    source: str | None = None
    accum_steps: int | None = None
    """The policy's accumulation (``Share.accum_steps``), passed whole; None: the trainer's own
    rule (the smallest that fits ``max_batch_per_gpu``), for plans no policy decided."""

    def __post_init__(self) -> None:
        if not (isinstance(self.version, int) and self.version >= 0):
            raise ValueError(f"Plan.version={self.version!r}: must be an integer >= 0")
        object.__setattr__(self, "kind", PlanKind(self.kind))
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"Plan.members={self.members!r}: must be distinct")
        if self.kind in (PlanKind.STOP, PlanKind.CHECKPOINT_STOP):
            if self.members:
                raise ValueError(f"Plan.members={self.members!r}: a {self.kind.value} plan has no members")
        else:
            if not self.members:
                raise ValueError(f"Plan.members=(): a {self.kind.value} plan needs at least one member")
            if self.global_batch < len(self.members):
                raise ValueError(
                    f"global_batch={self.global_batch!r}: must be >= world_size={len(self.members)} so every rank gets a sample"
                )
        if self.source is not None and self.source != FROM_CHECKPOINT and self.source not in self.members:
            raise ValueError(f"Plan.source={self.source!r}: not among members {self.members!r}")
        if self.accum_steps is not None:
            if not (isinstance(self.accum_steps, int) and not isinstance(self.accum_steps, bool) and self.accum_steps >= 1):
                raise ValueError(f"Plan.accum_steps={self.accum_steps!r}: must be an integer >= 1 or None")
            if self.members and self.global_batch < len(self.members) * self.accum_steps:
                raise ValueError(
                    f"Plan.accum_steps={self.accum_steps!r}: global batch {self.global_batch} leaves some of "
                    f"{len(self.members)} GPUs x {self.accum_steps} micro-steps no sample"
                )

    def __reduce__(self) -> tuple:
        # Every rank unpickles the plan at a switch; members as one string split on load cost
        # about 0.6 of a tuple of strings at 1,024 members (docs/elastic.md, control plane at scale).
        members: str | tuple[str, ...] = _MEMBER_SEP.join(self.members)
        if not members or any(_MEMBER_SEP in m for m in self.members):  # () or ("",), or a separator inside: as is
            members = self.members
        return (_plan_from_wire, (self.version, self.kind.value, members, self.global_batch, self.at_step, self.source, self.accum_steps))


_MEMBER_SEP = "\n"


def _plan_from_wire(version: int, kind: str, members: str | tuple[str, ...], global_batch: int, at_step: int | None, source: str | None, accum_steps: int | None) -> Plan:
    """A pickled ``Plan`` back, unchecked as unpickling always is (it was checked when made)."""
    if isinstance(members, str):
        members = tuple(members.split(_MEMBER_SEP))
    plan = object.__new__(Plan)
    for name, value in (("version", version), ("kind", PlanKind(kind)), ("members", members), ("global_batch", global_batch),
                        ("at_step", at_step), ("source", source), ("accum_steps", accum_steps)):
        object.__setattr__(plan, name, value)
    return plan


def check_batch(batch: int, gpus: int = 1) -> None:
    """A job asked for ``gpus`` ranks at global batch ``batch``: every rank must get a sample (the one check, coordinator and ranks)."""
    if not (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 1):
        raise ValueError(f"gpus={gpus!r}: must be a positive integer")
    if not (isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1):
        raise ValueError(f"global_batch={batch!r}: must be a positive integer")
    if batch < gpus:
        raise ValueError(f"global_batch={batch!r}: must be >= gpus={gpus} so every rank gets a sample")


@dataclass(frozen=True, slots=True)
class RankSpec:
    """What one rank task needs: which job's board, who it is, and which plan version it joins at.

    ``board_id`` names the job's control plane on the scheduler: the job id plus a token of
    this coordinator, so running a job id again on a long-lived scheduler starts clean.
    """

    board_id: str
    uid: str
    entrypoint: str
    config: TrainConfig
    join_version: int
    delay_s: float = 0.0  # injected per-step slowdown (straggler tests and demos)


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int  # the step that produced this record (0-based)
    loss: float  # mean loss over the global batch
    accuracy: float
    world_size: int
    global_batch: int
    lr: float
    wall_s: float = 0.0  # from this step's start to the next step's start, on the recording rank
    agree_s: float = 0.0  # of which spent blocked on this step's agreement (it overlaps the next step)
    cpu_s: float = 0.0  # CPU time of the recording rank's process (all its threads) over wall_s
    noise_scale: float | None = None  # smoothed gradient noise scale B_noise so far (elastic_tasks.rank.noise.scale)
    # The samples ``loss``/``accuracy`` average over when not the global batch: the step's
    # agreement failed with its group (a peer died), so only this rank's own samples are known.
    loss_samples: int | None = None
    group_lrs: tuple[float, ...] = ()  # the LR each parameter group stepped with (``lr`` is the first's)


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    """A generation change as one rank lived it; ``pause_s`` is the training time it cost."""

    version: int
    kind: PlanKind
    step: int
    world_size: int
    global_batch: int
    pause_s: float
    state_from: str | None


@dataclass(frozen=True, slots=True)
class EvalResult:
    loss: float | None  # None: the recipe's eval_fn returned no "loss"
    accuracy: float | None  # None: the recipe's batches are not (x, y) classification
    samples: int
    metrics: tuple[tuple[str, float], ...] = ()  # eval_fn's metrics, or eval_metrics' sample-weighted means
    step: int | None = None  # steps done when it was taken

    def metric(self, name: str) -> float | None:
        return dict(self.metrics).get(name)


@dataclass(frozen=True, slots=True)
class RankResult:
    uid: str
    exit: RankExit
    step: int
    samples_seen: int
    history: tuple[StepRecord, ...] = ()
    switches: tuple[SwitchRecord, ...] = ()
    indices: tuple[tuple[int, tuple[int, ...]], ...] = ()
    stragglers: tuple[tuple[int, str], ...] = ()  # (step, uid) when a rank was first flagged
    recoveries: tuple[tuple[int, int], ...] = ()  # (failed generation, step this rank held)
    eval: EvalResult | None = None
    step_time_s: float = 0.0  # median wall time per step in this rank's last generation
    evals: tuple[EvalResult, ...] = ()  # periodic evaluations this rank took part in (recipe.eval_every)
    wall: tuple[PhaseInterval, ...] = ()  # where this rank's wall time went (allocator.wall_split)
