"""A deterministic synthetic classification task that a small network can really learn.

Every sample is generated from its index alone (a per-index seeded generator), so any
process that asks for index ``i`` gets the same tensor without holding the data set in
memory, and ranks can shard by index. Labels come from a fixed random *teacher* network
(seeded once), so the task has a real, learnable input->label rule:

* images ``(C, H, W)``: smooth images (a coarse Gaussian grid upsampled) plus a little
  pixel noise; the teacher is conv3x3 -> ReLU -> global average pool -> linear, a rule a
  CNN can represent exactly.
* vectors ``(D,)``: Gaussian features; the teacher is linear -> tanh -> linear.

Teacher features are standardised on a calibration sample and per-class biases are fitted
there so classes come out roughly balanced (a raw random teacher often puts most samples
in one class). Labels are computed in
float64 so near-ties resolve the same way on every process and thread count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

_SPLIT_STRIDE = 1 << 31  # index space per split: train and eval samples never share a key
_MASK64 = (1 << 64) - 1
_SPLITS = {"train": 0, "eval": 1}
_CALIBRATION_SAMPLES = 2048


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """What the synthetic task looks like; the same spec and seed give the same task everywhere."""

    shape: tuple[int, ...]
    num_classes: int
    seed: int = 0
    noise: float = 0.1
    teacher_width: int = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if len(self.shape) not in (1, 3) or any(not isinstance(d, int) or d <= 0 for d in self.shape):
            raise ValueError(f"SyntheticSpec.shape={self.shape!r}: expected (D,) or (C, H, W) of positive integers")
        if len(self.shape) == 3 and (self.shape[1] < 4 or self.shape[2] < 4):
            raise ValueError(f"SyntheticSpec.shape={self.shape!r}: images must be at least 4x4")
        if not (isinstance(self.num_classes, int) and self.num_classes >= 2):
            raise ValueError(f"SyntheticSpec.num_classes={self.num_classes!r}: must be an integer >= 2")
        if not (isinstance(self.seed, int) and 0 <= self.seed < (1 << 30)):
            raise ValueError(f"SyntheticSpec.seed={self.seed!r}: must be an integer in [0, 2**30)")
        if not (self.noise >= 0 and math.isfinite(self.noise)):
            raise ValueError(f"SyntheticSpec.noise={self.noise!r}: must be a finite number >= 0")
        if not (isinstance(self.teacher_width, int) and self.teacher_width > 0):
            raise ValueError(f"SyntheticSpec.teacher_width={self.teacher_width!r}: must be a positive integer")


class _Teacher:
    """The fixed random rule that labels inputs; float64 throughout."""

    def __init__(self, spec: SyntheticSpec) -> None:
        g = torch.Generator().manual_seed(_seed32(~spec.seed & _MASK64))
        w = spec.teacher_width
        if len(spec.shape) == 3:
            c = spec.shape[0]
            self.conv = torch.randn(w, c, 3, 3, generator=g, dtype=torch.float64) / math.sqrt(9 * c)
            self.conv_bias = torch.randn(w, generator=g, dtype=torch.float64) * 0.5
        else:
            d = spec.shape[0]
            self.hidden = torch.randn(w, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        head = torch.randn(spec.num_classes, w, generator=g, dtype=torch.float64)
        # Unit-norm rows over standardised features give every class logit the same spread,
        # which keeps the classes roughly balanced.
        self.head = head / head.norm(dim=1, keepdim=True)
        self.feature_mean = torch.zeros(w, dtype=torch.float64)
        self.feature_std = torch.ones(w, dtype=torch.float64)
        self.class_bias = torch.zeros(spec.num_classes, dtype=torch.float64)

    def calibrate(self, inputs: torch.Tensor) -> None:
        """Standardise features and fit per-class biases so the classes are roughly balanced.

        Teacher features are correlated, so a random head alone can leave some classes
        nearly empty; nudging each class bias by its log over-representation (a fixed
        number of deterministic steps) evens the counts without changing the rule's form.
        """
        h = self.features(inputs)
        self.feature_mean = h.mean(dim=0)
        self.feature_std = h.std(dim=0) + 1e-12
        raw = self.logits(inputs)
        k = raw.shape[1]
        bias = torch.zeros(k, dtype=torch.float64)
        for _ in range(200):
            counts = torch.bincount((raw - bias).argmax(dim=1), minlength=k).to(torch.float64)
            bias += 0.1 * torch.log((counts + 1.0) / (len(raw) / k + 1.0))
        self.class_bias = bias

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float64)
        if x.dim() == 4:
            h = F.relu(F.conv2d(x, self.conv, self.conv_bias, padding=1))
            return h.mean(dim=(2, 3))
        return torch.tanh(x @ self.hidden.T)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        z = (self.features(x) - self.feature_mean) / self.feature_std
        return z @ self.head.T - self.class_bias


class SyntheticClassification(Dataset):
    """Map-style data set of ``size`` samples of one split ("train" or "eval") of a task."""

    def __init__(self, spec: SyntheticSpec, size: int, split: str = "train", *, _teacher: _Teacher | None = None) -> None:
        if not (isinstance(size, int) and 0 < size < _SPLIT_STRIDE):
            raise ValueError(f"SyntheticClassification.size={size!r}: must be a positive integer below 2**31")
        if split not in _SPLITS:
            raise ValueError(f"SyntheticClassification.split={split!r}: expected one of {sorted(_SPLITS)}")
        self.spec = spec
        self.size = size
        self.split = split
        self._base = (spec.seed * len(_SPLITS) + _SPLITS[split]) * _SPLIT_STRIDE
        if _teacher is None:
            _teacher = _Teacher(spec)
            # Calibration inputs use an index range no split uses, so labels never depend on `size`.
            calib_base = (spec.seed * len(_SPLITS) + len(_SPLITS)) * _SPLIT_STRIDE
            calib = torch.stack([_make_input(spec, calib_base + i) for i in range(_CALIBRATION_SAMPLES)])
            _teacher.calibrate(calib)
        self._teacher = _teacher

    def other_split(self, split: str, size: int) -> SyntheticClassification:
        """The same task's ``split`` with ``size`` samples, sharing this one's calibrated teacher."""
        return SyntheticClassification(self.spec, size, split, _teacher=self._teacher)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not (0 <= index < self.size):
            raise IndexError(f"index {index} out of range for {self.size} samples")
        x = _make_input(self.spec, self._base + int(index))
        y = self._teacher.logits(x.unsqueeze(0)).argmax(dim=1)[0]
        return x, y

    def label_counts(self, limit: int = 2048) -> list[int]:
        """Samples per class among the first ``limit`` samples (a balance check)."""
        counts = [0] * self.spec.num_classes
        for i in range(min(limit, self.size)):
            counts[int(self[i][1])] += 1
        return counts


def _seed32(key: int) -> int:
    """splitmix64 of a sample's key, folded to 32 bits.

    torch's CPU generator keeps only the low 32 bits of a seed, so keys that differ only
    above bit 31 (another split, another task seed) would repeat samples without mixing.
    """
    z = (key + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z ^ (z >> 32)) & 0xFFFFFFFF


def _make_input(spec: SyntheticSpec, key: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed32(key))
    if len(spec.shape) == 1:
        return torch.randn(spec.shape, generator=g)
    c, h, w = spec.shape
    coarse = torch.randn(1, c, max(2, h // 4), max(2, w // 4), generator=g)
    smooth = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)[0]
    return smooth + spec.noise * torch.randn(c, h, w, generator=g)
