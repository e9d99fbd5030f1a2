"""How long a job's coordinator and its ranks wait for each other, and why those values.

``TrainConfig.timeout_s`` bounds one rendezvous or collective; a wait that spans several of
them scales with it. Fixed floors cover what does not: importing torch, building a recipe.
Polling intervals only set how soon a waiter notices something; no result depends on them.
"""

from __future__ import annotations

from elastic_tasks.protocol import TrainConfig

# A new rank imports torch, builds its recipe and starts its DataLoader workers before it
# reports ready; seconds on an idle machine, many times that on a loaded one (CI runs several
# 3-worker clusters on 2 cores). Failing a healthy job for a slow start costs more than waiting.
STARTUP_FLOOR_S = 120.0
# A generation change spans several collectives, each bounded by ``timeout_s``: the
# rendezvous, the state broadcast, the first step's allreduce and its agreement.
COLLECTIVES_PER_SWITCH = 4
# A rank waits for a plan (its first, or the recovery plan after a failed collective) while
# the coordinator gathers the others (every joiner ready, or every member of a failed
# generation reported); past this the coordinator is gone or gave up, and the rank frees its worker.
PLAN_WAIT_FLOOR_S = 60.0
# A rank waiting for its recovery plan looks this often: the pause is measured from the
# failure, so a few tens of ms of polling are noise next to the regroup itself.
RECOVERY_POLL_S = 0.05


def startup_s(config: TrainConfig) -> float:
    """The longest the coordinator waits for ranks to start, stop or apply a plan."""
    return max(STARTUP_FLOOR_S, COLLECTIVES_PER_SWITCH * config.timeout_s)


def plan_wait_s(config: TrainConfig) -> float:
    """The longest a rank waits for the plan it is to join: ``config.plan_wait_s`` where set."""
    if config.plan_wait_s is not None:
        return config.plan_wait_s
    return max(PLAN_WAIT_FLOOR_S, COLLECTIVES_PER_SWITCH * config.timeout_s)


def rendezvous_wait_s(config: TrainConfig, patient: bool) -> float:
    """The longest a rank waits at its generation's rendezvous: for rank 0 to open it, or for
    every member to check in (rank/process_group.arrival_barrier).

    Members of a running generation switch at the step boundary they agreed on: one control
    timeout (``patient`` False). Patient waits take as long as the wait for a plan:

    * a rank joining waits for rank 0 to open: it read the plan as soon as it was published,
      while rank 0 may still have a step, its agreement, an evaluation or a checkpoint to finish
      (at the start, its recipe to build). Waiting only ``timeout_s`` failed a grow on a loaded
      host (docs/benchmarks.md: "did not open a rendezvous within 60 s", the job's timeout_s;
      the scheduler logs that same wait's end as a timed-out ``variable_get``);
    * every rank waits for the others to check in where the plan was published as its ranks
      launched (a start, a relaunch from the checkpoint): some may still be starting.
    """
    return plan_wait_s(config) if patient else config.timeout_s


def suspend_s(config: TrainConfig) -> float:
    """A checkpoint-stop takes effect at the next step boundary: a step and a switch's collectives at most."""
    return COLLECTIVES_PER_SWITCH * config.timeout_s
