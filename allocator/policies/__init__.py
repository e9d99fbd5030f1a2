"""Allocation policies, one per module, all behind ``Policy`` and found through the registry.

Importing this package registers every built-in policy.
"""

from allocator.policies import efficiency_threshold, elan_backfill, elan_fifo, elastic_dp, fixed_batch, goodput_dp, idle_nodes_fifo, idle_nodes_greedy, idle_nodes_milp  # noqa: F401  (registration side effect)
from allocator.policies.base import (
    Policy,
    PolicyVariant,
    SupportsMinGpus,
    UnknownPolicyError,
    available_policies,
    coerce_param,
    effective_parameters,
    make_policy,
    parse_policy,
    policy_defaults,
    policy_parameters,
    register,
)

__all__ = [
    "Policy", "PolicyVariant", "SupportsMinGpus", "UnknownPolicyError", "available_policies", "coerce_param", "effective_parameters",
    "make_policy", "parse_policy", "policy_defaults", "policy_parameters", "register",
]  # fmt: skip
