"""A job's gradient noise scale B_noise over its progress, and the forms files give it in.

B_noise = tr(Σ) / |G|² (McCandlish et al. 2018, eq. 2.8): Σ the per-sample gradient covariance,
G the true gradient. It sets how much a larger batch is worth (``allocator.physics.goodput``).

Forms a jobs file, a trace or a profile accepts in its ``noise_scale`` field (``noise_from_value``):

* a number: B_noise, constant over the job (``noise_scale: 200``);
* a trajectory over the fraction of work done: ``{fractions: [0, 0.5, 0.9], values: [100, 400, 1600]}``
  — from fraction f_i of the work on, B_noise is v_i (``fractions`` start at 0 and rise);
* measured at a stated batch, as AdaptDL/Pollux record it: ``{at_batch: M, grad_sqr: S, grad_var: V}``
  (numbers, or lists with ``fractions``), with S = |G|² and V the variance tr(Σ)/M of a
  gradient averaged over M samples. The standard scaling Var[mean of M] = tr(Σ) / M gives
  B_noise = M · V / S (Pollux's "PGNS = grad_var / grad_sqr × init_batch_size").

Pure: no files (``flows.config`` reads them).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocator.strict import check_fields

NOISE_FIELDS = ("fractions", "values", "at_batch", "grad_sqr", "grad_var")


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and not math.isnan(value)):
        raise ValueError(f"{name}={value!r}: must be a number > 0 (inf allowed: no gradient noise limit)")


@dataclass(frozen=True, slots=True)
class NoiseTrajectory:
    """A job's gradient noise scale over its progress, piecewise constant.

    ``bounds`` are progress fractions 0 = f0 < f1 < ... < fn = 1; ``values[i]`` is B_noise on
    [f_i, f_{i+1}). B_noise typically grows as training proceeds (McCandlish et al., Fig. 6),
    which is why a goodput policy raises batches late in a job.
    """

    bounds: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "bounds", tuple(float(b) for b in self.bounds))
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        b, v = self.bounds, self.values
        if len(b) < 2 or b[0] != 0.0 or b[-1] != 1.0 or any(y <= x for x, y in zip(b, b[1:])):
            raise ValueError(f"NoiseTrajectory.bounds={b!r}: must rise strictly from 0 to 1")
        if len(v) != len(b) - 1:
            raise ValueError(f"NoiseTrajectory.values={v!r}: need {len(b) - 1} values for {len(b)} bounds")
        for x in v:
            _check_positive("NoiseTrajectory.values", x)

    @classmethod
    def constant(cls, noise_scale: float) -> NoiseTrajectory:
        return cls((0.0, 1.0), (noise_scale,))

    @classmethod
    def from_points(cls, fractions: Sequence[float], noise_scales: Sequence[float]) -> NoiseTrajectory:
        """Measured (progress fraction, B_noise) points -> segments split halfway between points."""
        if len(fractions) == 0 or len(fractions) != len(noise_scales):
            raise ValueError(f"fractions={list(fractions)!r}: need one per noise scale, at least one")
        order = sorted(range(len(fractions)), key=lambda i: float(fractions[i]))
        f = [float(fractions[i]) for i in order]
        v = [float(noise_scales[i]) for i in order]
        mids = [round((a + b) / 2, 12) for a, b in zip(f, f[1:])]  # 0.3, not 0.30000000000000004, in files
        return cls((0.0, *mids, 1.0), tuple(v))

    @property
    def is_constant(self) -> bool:
        return len(self.values) == 1

    def at(self, fraction: float) -> float:
        i = bisect.bisect_right(self.bounds, min(max(fraction, 0.0), 1.0)) - 1
        return self.values[min(i, len(self.values) - 1)]


def noise_from_stats(at_batch: float, grad_sqr: float, grad_var: float) -> float:
    """B_noise from gradient statistics measured at batch M: M · V / S (V = tr(Σ)/M, S = |G|²)."""
    return at_batch * grad_var / grad_sqr


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}={value!r}: must be a number")
    return float(value)


def _numbers(value: object, where: str) -> list[float]:
    """A number or a non-empty list of numbers, as a list."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{where}=[]: must not be empty")
        return [_number(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return [_number(value, where)]


def _steps(fractions: list[float] | None, values: list[float], where: str) -> NoiseTrajectory:
    """Values holding from each fraction on (a step function over the work done)."""
    if fractions is None:
        if len(values) != 1:
            raise ValueError(f"{where}.fractions: missing (give one fraction per value when there are {len(values)} values)")
        fractions = [0.0]
    if len(fractions) != len(values):
        raise ValueError(f"{where}.fractions={fractions!r}: {len(fractions)} fractions for {len(values)} values")
    if fractions[0] != 0.0 or any(b <= a for a, b in zip(fractions, fractions[1:])) or fractions[-1] >= 1.0:
        raise ValueError(f"{where}.fractions={fractions!r}: must start at 0 and rise strictly, each below 1 (value i holds from fraction i on)")
    for i, v in enumerate(values):
        if not (v > 0):
            raise ValueError(f"{where}.values[{i}]={v!r}: must be a number > 0 (inf allowed: no gradient noise limit)")
    return NoiseTrajectory((*fractions, 1.0), tuple(values))


def noise_from_value(value: object, where: str = "noise_scale") -> NoiseTrajectory:
    """Any of the module's forms -> a trajectory; ValueError naming ``where`` and the field."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (value > 0):
            raise ValueError(f"{where}={value!r}: must be a number > 0 (inf allowed: no gradient noise limit)")
        return NoiseTrajectory.constant(float(value))
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}={value!r}: expected a number, or a mapping with fractions and values (or at_batch, grad_sqr, grad_var)")
    check_fields(value, NOISE_FIELDS, where)
    fractions = _numbers(value["fractions"], f"{where}.fractions") if "fractions" in value else None
    stats = [k for k in ("at_batch", "grad_sqr", "grad_var") if k in value]
    if "values" in value:
        if stats:
            raise ValueError(f"{where}.{stats[0]}: give either values (B_noise itself) or at_batch, grad_sqr and grad_var, not both")
        return _steps(fractions, _numbers(value["values"], f"{where}.values"), where)
    if not stats:
        raise ValueError(f"{where}.values: missing required field (or give at_batch, grad_sqr and grad_var)")
    for key in ("at_batch", "grad_sqr", "grad_var"):
        if key not in value:
            raise ValueError(f"{where}.{key}: missing required field (at_batch, grad_sqr and grad_var go together)")
    at_batch = _number(value["at_batch"], f"{where}.at_batch")
    if not (at_batch >= 1 and math.isfinite(at_batch)):
        raise ValueError(f"{where}.at_batch={value['at_batch']!r}: must be a batch size >= 1")
    sqr = _numbers(value["grad_sqr"], f"{where}.grad_sqr")
    var = _numbers(value["grad_var"], f"{where}.grad_var")
    if len(sqr) != len(var):
        raise ValueError(f"{where}.grad_var: {len(var)} values for {len(sqr)} grad_sqr values")
    for i, (s, v) in enumerate(zip(sqr, var)):
        if not (s > 0 and math.isfinite(s)):
            raise ValueError(f"{where}.grad_sqr[{i}]={s!r}: must be a finite number > 0")
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{where}.grad_var[{i}]={v!r}: must be a finite number > 0")
    return _steps(fractions, [noise_from_stats(at_batch, s, v) for s, v in zip(sqr, var)], where)


def noise_to_value(trajectory: NoiseTrajectory) -> object:
    """The canonical form: a number when constant, else ``{fractions, values}`` (inverse of ``noise_from_value``)."""
    if trajectory.is_constant:
        return trajectory.values[0] if math.isfinite(trajectory.values[0]) else math.inf
    return {"fractions": list(trajectory.bounds[:-1]), "values": list(trajectory.values)}


def noise_from_cell(text: str, where: str) -> NoiseTrajectory:
    """A trace cell: a number, ``f:v f:v ...`` (value v from fraction f on; ``;`` also separates), or a JSON mapping."""
    text = text.strip()
    if text.startswith("{"):
        try:
            return noise_from_value(json.loads(text), where)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}={text!r}: not a valid JSON mapping ({exc})") from None
    try:
        if ":" not in text:
            number = float(text)
            if not (number > 0):
                raise ValueError(f"{where}={text!r}: must be a number > 0 (inf allowed: no gradient noise limit)")
            return NoiseTrajectory.constant(number)
        pairs = [p.split(":") for p in text.replace(";", " ").split()]
        if any(len(p) != 2 for p in pairs):
            raise ValueError
        return noise_from_value({"fractions": [float(f) for f, _ in pairs], "values": [float(v) for _, v in pairs]}, where)
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise ValueError(f"{where}={text!r}: expected a number, 'fraction:value fraction:value ...' or a JSON mapping") from None


def noise_to_cell(trajectory: NoiseTrajectory) -> str:
    """``noise_from_cell``'s inverse: a number, or ``f:v f:v ...``."""
    if trajectory.is_constant:
        return repr(trajectory.values[0])
    return " ".join(f"{f!r}:{v!r}" for f, v in zip(trajectory.bounds, trajectory.values))
