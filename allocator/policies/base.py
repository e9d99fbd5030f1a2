"""The registry that names policies (the ``Policy`` protocol itself lives at the bottom of
the package, in ``allocator/protocols.py``, and is re-exported here).

Each policy module registers its own factory with ``@register``; nothing dispatches on
name strings elsewhere. Factories take keyword parameters (e.g. a seed or a threshold)
so a policy's settings travel with its name.

A policy *variant* is a name with some of its parameters set, written
``goodput_dp:p=-1,remaining_exponent=0`` (``parse_policy``); every route that builds a policy
from text (the CLI's ``-p``, a service's configured policy, a summary file being rerun) goes
through ``make_policy``, so a parameter left out takes the factory's own default everywhere,
and a parameter's text is read by the type of that default (``coerce_param``), with an error
naming the policy, the parameter and the value.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from allocator.protocols import Policy, SupportsMinGpus

__all__ = [
    "Policy", "PolicyFactory", "PolicyVariant", "SupportsMinGpus", "UnknownPolicyError", "available_policies", "coerce_param",
    "effective_parameters", "make_policy", "parse_policy", "policy_defaults", "policy_parameters", "register",
]  # fmt: skip


class UnknownPolicyError(ValueError):
    pass


PolicyFactory = Callable[..., Policy]
_REGISTRY: dict[str, PolicyFactory] = {}
_KINDS = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    def wrap(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"policy {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return wrap


def available_policies() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def _factory(name: str) -> PolicyFactory:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(f"policy={name!r}: unknown policy; choose one of {', '.join(available_policies())}") from None


def _signature(name: str) -> dict[str, inspect.Parameter]:
    return {p.name: p for p in inspect.signature(_factory(name)).parameters.values() if p.kind in _KINDS}


def make_policy(name: str, **params: object) -> Policy:
    """Build a registered policy. Unknown names raise UnknownPolicyError listing the known ones; a
    parameter the policy does not take, or text that does not read as its type, a ValueError naming
    ``name.parameter``."""
    factory = _factory(name)
    known = _signature(name)
    for key in params:
        if key not in known:
            takes = ", ".join(known) or "no parameters"
            raise ValueError(f"{name}.{key}: unknown parameter; {name} takes {takes}")
    return factory(**{key: coerce_param(name, key, value) for key, value in params.items()})


def policy_parameters(name: str) -> tuple[str, ...]:
    """The keyword parameters a registered policy's factory names (what a caller may set)."""
    return tuple(_signature(name))


def policy_defaults(name: str) -> dict[str, object]:
    """Each parameter's default, as the factory declares it (what every route uses when it is left out)."""
    return {key: p.default for key, p in _signature(name).items() if p.default is not inspect.Parameter.empty}


def effective_parameters(name: str, params: Mapping[str, object] | None = None) -> dict[str, object]:
    """The parameters a policy built from ``params`` runs with: its defaults, overridden by ``params``
    (coerced as ``make_policy`` reads them)."""
    given = {key: coerce_param(name, key, value) for key, value in (params or {}).items()}
    return policy_defaults(name) | given


# -- reading a parameter from text -----------------------------------------------------------

_TRUE, _FALSE = ("true",), ("false",)


def _kind(name: str, key: str) -> str:
    """bool, int, float or text: from the parameter's default, else its annotation (``int | None``)."""
    parameter = _signature(name).get(key)
    if parameter is None:
        return "text"
    default = parameter.default
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int) and not isinstance(default, Enum):
        return "int"
    if isinstance(default, float):
        return "float"
    annotation = str(parameter.annotation).replace(" ", "")
    for kind in ("bool", "float", "int"):
        if kind in annotation.split("|"):
            return kind
    return "text"


def coerce_param(name: str, key: str, value: object) -> object:
    """``value`` as the type policy ``name`` declares for ``key``; only text is converted (a Python
    caller's typed value passes as is). ``none``/``null`` is None for a parameter that defaults to None."""
    if not isinstance(value, str):
        return value
    kind = _kind(name, key)
    text = value.strip()
    parameter = _signature(name).get(key)
    if parameter is not None and parameter.default is None and text.lower() in ("none", "null"):
        return None
    try:
        if kind == "bool":
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise ValueError
        if kind == "int":
            return int(text)
        if kind == "float":
            number = float(text)
            if math.isnan(number):
                raise ValueError
            return number
    except ValueError:
        what = {"bool": "true or false", "int": "an integer", "float": "a number"}[kind]
        raise ValueError(f"{name}.{key}={value!r}: must be {what}") from None
    return value


# -- variants: a name with parameters, from one line of text ---------------------------------


@dataclass(frozen=True, slots=True)
class PolicyVariant:
    """A policy name with the parameters set for it (as given: text stays text until ``build``),
    and the label it is shown and filed under (default: its text form)."""

    name: str
    params: tuple[tuple[str, object], ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        _factory(self.name)
        keys = [k for k, _ in self.params]
        if len(set(keys)) != len(keys):
            twice = sorted({k for k in keys if keys.count(k) > 1})[0]
            raise ValueError(f"{self.name}.{twice}: given twice")
        if not self.label:
            object.__setattr__(self, "label", self.text)

    @property
    def text(self) -> str:
        """``name:key=value,...`` — what ``parse_policy`` reads back as this variant."""
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in self.params) if self.params else "")

    def build(self) -> Policy:
        return make_policy(self.name, **dict(self.params))

    def effective(self) -> dict[str, object]:
        return effective_parameters(self.name, dict(self.params))

    def with_defaults(self, params: Mapping[str, object]) -> PolicyVariant:
        """The same variant with ``params`` added where it sets none of its own (its label kept)."""
        own = dict(self.params)
        extra = tuple((k, v) for k, v in params.items() if k not in own)
        return PolicyVariant(self.name, self.params + extra, self.label)


def parse_policy(text: str) -> PolicyVariant:
    """``NAME`` or ``NAME:KEY=VALUE[,KEY=VALUE...]`` -> a variant; each key must be one the policy
    takes and each value must read as its type (both checked here, before any work)."""
    name, colon, rest = text.strip().partition(":")
    _factory(name)
    params: list[tuple[str, object]] = []
    if colon:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key:
                raise ValueError(f"policy={text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...], got {item!r}")
            if key not in _signature(name):
                takes = ", ".join(_signature(name)) or "no parameters"
                raise ValueError(f"{name}.{key}: unknown parameter; {name} takes {takes}")
            coerce_param(name, key, value)
            params.append((key, value.strip()))
    return PolicyVariant(name, tuple(params), text.strip())
