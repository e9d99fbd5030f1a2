"""HPO job-file entries (parsed YAML/JSON) -> ``HpoSpec``, every error naming the field.

Format (docs/hpo.md has the full reference)::

    name: resnet-sha
    deadline_s: 1200
    sha: {trials: 64, eta: 2, min_iters: 24, max_iters: 3048}   # or stages: [{trials, iters}, ...]
    trial: {profile: <name or inline profile>, batch: 512, startup_s: 5, sync_s: 0, iter_cv: 0}
    cloud: {instance: {name: p3.8xlarge, gpus: 4, hourly_price: 12.24}, billing: per_instance,
            granularity_s: 1, min_charge_s: 60, provision_s: 10, init_s: 10, max_instances: 64}
    search_space: {lr: {loguniform: [1.0e-4, 0.1]}, width: {choice: [8, 16]}}

A latency is a number of seconds or ``{mean_s, cv}``. File reading and resolving a profile
given as a path live in ``flows.config.hpo_file``; this module only validates.
"""

from __future__ import annotations

from collections.abc import Mapping

from allocator.hpo.spec import (
    Billing,
    CloudModel,
    HpoSpec,
    InstanceType,
    Latency,
    ParamKind,
    SearchParam,
    Stage,
    TrialModel,
    successive_halving,
)
from allocator.profiles.io import profile_from_dict
from allocator.strict import check_fields, mapping
from allocator.types import AllreduceModel, ThroughputProfile

_TOP = frozenset({"name", "deadline_s", "sha", "stages", "trial", "cloud", "search_space", "entrypoint", "seed"})
_SHA = frozenset({"trials", "eta", "min_iters", "max_iters"})
_TRIAL = frozenset({"profile", "batch", "startup_s", "sync_s", "iter_cv", "max_gpus_per_trial"})
_CLOUD = frozenset(
    {"instance", "billing", "granularity_s", "min_charge_s", "provision_s", "init_s", "max_instances", "data_gb", "data_price_per_gb"}
)
_INSTANCE = frozenset({"name", "gpus", "hourly_price", "inter_node_allreduce"})


def _wrap(where: str, build):  # noqa: ANN001, ANN202 - a local helper for one pattern
    try:
        return build()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def latency_from(value: object, where: str) -> Latency:
    if isinstance(value, Mapping):
        check_fields(value, frozenset({"mean_s", "cv"}), where, ("mean_s",))
        return _wrap(where, lambda: Latency(value["mean_s"], value.get("cv", 0.0)))
    return _wrap(where, lambda: Latency(value))


def stages_from(data: Mapping[str, object]) -> tuple[Stage, ...]:
    if ("sha" in data) == ("stages" in data):
        raise ValueError("hpo file.sha: give exactly one of 'sha' (successive halving) or 'stages' (explicit)")
    if "sha" in data:
        sha = mapping(data["sha"], "sha")
        check_fields(sha, _SHA, "sha", tuple(sorted(_SHA)))
        return _wrap("sha", lambda: successive_halving(sha["trials"], sha["eta"], sha["min_iters"], sha["max_iters"]))
    raw = data["stages"]
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"stages={raw!r}: must be a non-empty list of {{trials, iters}}")
    out = []
    for i, entry in enumerate(raw):
        entry = mapping(entry, f"stages[{i}]")
        check_fields(entry, frozenset({"trials", "iters"}), f"stages[{i}]", ("trials", "iters"))
        out.append(_wrap(f"stages[{i}]", lambda e=entry: Stage(e["trials"], e["iters"])))
    return tuple(out)


def trial_from(value: object, profiles: Mapping[str, ThroughputProfile]) -> TrialModel:
    data = mapping(value, "trial")
    check_fields(data, _TRIAL, "trial", ("profile", "batch"))
    ref = data["profile"]
    if isinstance(ref, str):
        if ref not in profiles:
            raise ValueError(f"trial.profile={ref!r}: no such profile (known: {', '.join(sorted(profiles)) or 'none'})")
        profile = profiles[ref]
    else:
        profile = profile_from_dict(ref, "trial.profile")
    return _wrap(
        "trial",
        lambda: TrialModel(
            profile=profile,
            batch=data["batch"],
            startup=latency_from(data.get("startup_s", 0.0), "trial.startup_s"),
            sync=latency_from(data.get("sync_s", 0.0), "trial.sync_s"),
            iter_cv=data.get("iter_cv", 0.0),
            max_gpus_per_trial=data.get("max_gpus_per_trial"),
        ),
    )


def _allreduce(value: object, where: str) -> AllreduceModel:
    data = mapping(value, where)
    check_fields(data, frozenset({"latency_s", "seconds_per_param"}), where)
    return _wrap(where, lambda: AllreduceModel(data.get("latency_s", 0.0), data.get("seconds_per_param", 0.0)))


def cloud_from(value: object) -> CloudModel:
    data = mapping(value, "cloud")
    check_fields(data, _CLOUD, "cloud", ("instance",))
    inst = mapping(data["instance"], "cloud.instance")
    check_fields(inst, _INSTANCE, "cloud.instance", ("name", "gpus", "hourly_price"))
    inter = inst.get("inter_node_allreduce")
    instance = _wrap(
        "cloud.instance",
        lambda: InstanceType(
            inst["name"], inst["gpus"], inst["hourly_price"], None if inter is None else _allreduce(inter, "cloud.instance.inter_node_allreduce")
        ),
    )
    billing = data.get("billing", Billing.PER_INSTANCE.value)
    if not isinstance(billing, str) or billing not in {b.value for b in Billing}:
        raise ValueError(f"cloud.billing={billing!r}: must be one of {', '.join(b.value for b in Billing)}")
    fields = {k: data[k] for k in ("granularity_s", "min_charge_s", "max_instances", "data_gb", "data_price_per_gb") if k in data}
    return _wrap(
        "cloud",
        lambda: CloudModel(
            instance=instance,
            billing=Billing(billing),
            provision=latency_from(data.get("provision_s", 0.0), "cloud.provision_s"),
            init=latency_from(data.get("init_s", 0.0), "cloud.init_s"),
            **fields,
        ),
    )


def param_from(name: object, value: object) -> SearchParam:
    where = f"search_space.{name}"
    data = mapping(value, where)
    if len(data) != 1:
        raise ValueError(f"{where}={dict(data)!r}: give exactly one of {', '.join(k.value for k in ParamKind)}")
    (kind, arg), = data.items()
    if kind not in {k.value for k in ParamKind}:
        raise ValueError(f"{where}.{kind}: unknown distribution (known: {', '.join(k.value for k in ParamKind)})")
    if not isinstance(arg, list) or not arg:
        raise ValueError(f"{where}.{kind}={arg!r}: must be a non-empty list")
    if kind == ParamKind.CHOICE.value:
        return _wrap(where, lambda: SearchParam(str(name), ParamKind.CHOICE, choices=tuple(arg)))
    if len(arg) != 2:
        raise ValueError(f"{where}.{kind}={arg!r}: must be [low, high]")
    return _wrap(where, lambda: SearchParam(str(name), ParamKind(kind), arg[0], arg[1]))


def hpo_spec_from_dict(data: object, profiles: Mapping[str, ThroughputProfile] | None = None) -> HpoSpec:
    """Validate a parsed HPO file. ``profiles``: profiles already loaded, by the name the file uses."""
    data = mapping(data, "hpo file")
    check_fields(data, _TOP, "hpo file", ("name", "deadline_s", "trial", "cloud"))
    stages = stages_from(data)
    trial = trial_from(data["trial"], profiles or {})
    cloud = cloud_from(data["cloud"])
    space_raw = data.get("search_space", {}) or {}
    space = tuple(param_from(k, v) for k, v in mapping(space_raw, "search_space").items())
    entrypoint = data.get("entrypoint")
    if entrypoint is not None and (not isinstance(entrypoint, str) or ":" not in entrypoint):
        raise ValueError(f"hpo file.entrypoint={entrypoint!r}: expected 'package.module:function'")
    return _wrap(
        "hpo file",
        lambda: HpoSpec(
            name=data["name"],
            stages=stages,
            trial=trial,
            cloud=cloud,
            deadline_s=data["deadline_s"],
            search_space=space,
            entrypoint=entrypoint,
            seed=data.get("seed", 0),
        ),
    )
