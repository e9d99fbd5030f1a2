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
    """The longest a rank waits for the plan it is to join."""
    return max(PLAN_WAIT_FLOOR_S, COLLECTIVES_PER_SWITCH * config.timeout_s)


def suspend_s(config: TrainConfig) -> float:
    """A checkpoint-stop takes effect at the next step boundary: a step and a switch's collectives at most."""
    return COLLECTIVES_PER_SWITCH * config.timeout_s
