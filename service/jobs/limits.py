"""One limit per field of a submitted job, enforced in one place for flags, jobs files, the Python
client and the service (issue 37.2, 35.3).

The limits are what every supported store holds and what a terminal can show: texts fit
PostgreSQL's ``varchar(255)`` (sqlite would store 10 MB and echo it), integers fit a signed
64-bit column, names hold no control characters (an escape sequence would reach an operator's
terminal raw), and numbers stay within what any cluster could mean (the same for
``--max-gpus`` and a jobs file's ``max_gpus``). A violation is ``JobFieldError``: a ValueError
whose one-line message names the job, the field and the value.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from allocator.types import JobSpec

# The store's String(255) columns (name, submitter, idempotency key).
MAX_TEXT = 255
# A workload lives in the spec's JSON (a Text column), and an HPO trial's entry point carries its
# parameters (~400 characters): bounded, but not by a varchar.
MAX_WORKLOAD = 8192
# A sane maximum for one job's work (10^15 samples: years on any cluster); inside int64.
MAX_SAMPLES = 10**15
# More GPUs than any one job could be given (the largest clusters hold ~10^5); inside int64.
MAX_GPUS = 2**20
INT64 = 2**63 - 1


def control_free(value: str) -> str:
    if any(not c.isprintable() for c in value):
        raise ValueError("holds control characters (newlines, escapes); use printable text")
    return value


class _Limits(BaseModel):
    """The fields a store row and a terminal carry, with their bounds."""

    model_config = ConfigDict(strict=True, frozen=True)

    id: str = Field(min_length=1, max_length=MAX_TEXT)
    workload: str = Field(min_length=1, max_length=MAX_WORKLOAD)
    total_samples: int = Field(ge=1, le=MAX_SAMPLES)
    min_gpus: int = Field(ge=1, le=MAX_GPUS)
    max_gpus: int = Field(ge=1, le=MAX_GPUS)
    requested_gpus: int = Field(ge=1, le=MAX_GPUS)
    priority: int = Field(ge=-INT64, le=INT64)
    seed: int | None = Field(None, ge=0, le=INT64)
    team: str | None = Field(None, min_length=1, max_length=MAX_TEXT)

    @field_validator("id", "workload", "team")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        return value if value is None else control_free(value)


class JobFieldError(ValueError):
    """One field of a job out of its limit; ``field`` and ``value`` let a caller name its flag."""

    def __init__(self, job_id: str, field: str, value: object, why: str) -> None:
        self.job_id, self.field, self.value, self.why = job_id, field, value, why
        super().__init__(f"job {quoted(job_id)}.{field}={quoted(value)}: {why}")


def shown_value(value: object, limit: int = 60) -> object:
    """A value as an error line may quote it: control characters escaped, at most ``limit`` characters."""
    if not isinstance(value, str):
        return value
    safe = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in value)
    return safe if len(safe) <= limit else f"{safe[: limit - 1]}… ({len(value):,} characters)"


def quoted(value: object) -> str:
    return f"'{shown_value(value)}'" if isinstance(value, str) else repr(value)


def _why(err: dict) -> str:
    kind, ctx = err.get("type", ""), err.get("ctx") or {}
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters (what the store holds)"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "less_than_equal":
        return f"must be <= {ctx.get('le'):,} (a sane maximum that every store holds)"
    if kind == "greater_than_equal":
        return f"must be >= {ctx.get('ge'):,}"
    return str(err.get("msg", "invalid")).removeprefix("Value error, ")


def check_limits(spec: JobSpec) -> JobSpec:
    """``spec`` if each field is within its limit, else JobFieldError naming the first one out."""
    fields = {name: getattr(spec, name) for name in _Limits.model_fields}
    try:
        _Limits(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err.get("loc") else "?"
        raise JobFieldError(spec.id if isinstance(spec.id, str) else "?", field, fields.get(field), _why(err)) from None
    return spec


def check_name(name: str | None, where: str = "--name") -> str | None:
    """A display name (``--name``): 1..255 printable characters."""
    if name is None:
        return None
    if not 1 <= len(name) <= MAX_TEXT:
        raise ValueError(f"{where}={quoted(shown_value(name, 40))}: must be 1 to {MAX_TEXT} characters (it has {len(name):,})")
    if any(not c.isprintable() for c in name):
        raise ValueError(f"{where}={quoted(shown_value(name, 40))}: holds control characters (newlines, escapes); use printable text")
    return name


def placement_problem(spec: JobSpec, service_gpus: int | None) -> str | None:
    """Why a service with ``service_gpus`` GPUs can never run ``spec`` (it needs more at its
    smallest), or None (also when the service's size is unknown)."""
    if service_gpus is None:
        return None
    need, field = (spec.min_gpus, "min_gpus") if spec.elastic else (spec.requested_gpus, "gpus")
    if need > service_gpus:
        return (
            f"job {quoted(spec.id)}.{field}={need}: needs {need} GPUs at its smallest, and the service on this store "
            f"has {service_gpus}: it could never start (lower {field}, or run it where there are {need} GPUs)"
        )
    return None
