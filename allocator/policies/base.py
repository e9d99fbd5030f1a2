"""The registry that names policies (the ``Policy`` protocol itself lives at the bottom of
the package, in ``allocator/protocols.py``, and is re-exported here).

Each policy module registers its own factory with ``@register``; nothing dispatches on
name strings elsewhere. Factories take keyword parameters (e.g. a seed or a threshold)
so a policy's settings travel with its name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from allocator.protocols import Policy, SupportsMinGpus

__all__ = ["Policy", "PolicyFactory", "SupportsMinGpus", "UnknownPolicyError", "available_policies", "make_policy", "policy_parameters", "register"]


class UnknownPolicyError(ValueError):
    pass


PolicyFactory = Callable[..., Policy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    def wrap(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"policy {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return wrap


def available_policies() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_policy(name: str, **params: object) -> Policy:
    """Build a registered policy; unknown names raise UnknownPolicyError listing the known ones."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(f"policy={name!r}: unknown policy; choose one of {', '.join(available_policies())}") from None
    return factory(**params)


def policy_parameters(name: str) -> tuple[str, ...]:
    """The keyword parameters a registered policy's factory names (what a caller may set)."""
    if name not in _REGISTRY:
        make_policy(name)  # raises UnknownPolicyError listing the known ones
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in inspect.signature(_REGISTRY[name]).parameters.values() if p.kind in kinds)
