"""The policy variants a ``simulate`` call compares: ``-p`` texts, ``--param`` and the queue flags.

``-p goodput_dp:p=-1,remaining_exponent=0`` is one variant (``allocator.policies.parse_policy``),
labelled by its text; the same name may come several times with different parameters.
``--param [POLICY:]KEY=VALUE`` sets a parameter on every variant of POLICY (unscoped: on every
variant) that does not set it itself; ``--strict-fifo``/``--backfill`` reaches a policy with its
own ``strict_fifo`` the same way. Nothing else is added: a parameter left out takes the policy's
own default, as it does from Python and in the service.
"""

from __future__ import annotations

from allocator.policies import PolicyVariant, parse_policy, policy_parameters


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "_.=-" else "_" for c in label)


def file_stem(label: str) -> str:
    """A label as part of a file name (``goodput_dp:p=-1`` -> ``goodput_dp_p=-1``)."""
    return _slug(label)


def policy_variants(texts: list[str], params: list[str], strict_fifo: bool | None) -> list[PolicyVariant]:
    """ValueError naming the flag, the policy and the parameter for anything wrong."""
    variants = [parse_policy(text) for text in texts]
    labels = [v.label for v in variants]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(f"policy={twice[0]!r}: given twice; each -p is one row")
    stems = [file_stem(label) for label in labels]
    clash = sorted({s for s in stems if stems.count(s) > 1})
    if clash:
        raise ValueError(f"policy: two variants would share the file name {clash[0]!r}; write their parameters differently")
    names = {v.name for v in variants}
    extra: dict[str, dict[str, object]] = {label: {} for label in labels}
    for raw in params:
        target, eq, value = raw.partition("=")
        scope, _, key = target.rpartition(":")
        if not eq or not key:
            raise ValueError(f"param={raw!r}: expected [POLICY:]KEY=VALUE")
        if scope and scope not in names:
            raise ValueError(f"param={raw!r}: policy {scope!r} is not among --policy {', '.join(sorted(names))}")
        if key == "noise":
            raise ValueError(
                f"param={raw!r}: noise scales belong to the jobs, where the physics and every policy read them: "
                "give each job (or its profile) a noise_scale field (docs/jobs-file.md), or pass --noise FILE.json"
            )
        for variant in variants:
            if scope and variant.name != scope:
                continue
            known = tuple(k for k in policy_parameters(variant.name) if k != "noise")
            if key not in known:
                raise ValueError(f"param={raw!r}: policy {variant.name} takes {', '.join(known) or 'no parameters'}")
            extra[variant.label][key] = value
    out = []
    for variant in variants:
        more = dict(extra[variant.label])
        if strict_fifo is not None and "strict_fifo" in policy_parameters(variant.name):
            more.setdefault("strict_fifo", strict_fifo)
        out.append(variant.with_defaults(more))
    return out
