"""Small networks shaped like seed 000's workloads, each with a width knob.

* ``ResNetish`` — ResNet-18 layout (4 stages x 2 basic blocks, BN, identity shortcuts):
  compute-heavy for its parameter count.
* ``AlexNetish`` — a short conv stack feeding large fully connected layers: most
  parameters sit in the FC layers, so it is communication-heavy (little compute per weight).
* ``VGGish`` — VGG-11-style 3x3 conv stacks with BN and max-pooling.
* ``MLP`` — two hidden layers on feature vectors: the fastest, for tests.

All take 3xHxW images with H, W >= 16 and divisible by 16 (MLP: vectors). None uses
dropout: its per-rank RNG would make an elastic run's loss differ from a fixed-size run
for reasons unrelated to rescaling.
"""

from __future__ import annotations

from torch import Tensor, nn


def _positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise ValueError(f"{owner}.{name}={value!r}: must be a positive integer")


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNetish(nn.Module):
    """ResNet-18 layout; width=64 gives about 11M parameters, width=8 about 0.18M."""

    def __init__(self, width: int = 16, num_classes: int = 10, in_channels: int = 3, blocks_per_stage: int = 2) -> None:
        super().__init__()
        _positive("ResNetish", width=width, num_classes=num_classes, in_channels=in_channels, blocks_per_stage=blocks_per_stage)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        layers: list[nn.Module] = []
        c_in = width
        for stage, mult in enumerate((1, 2, 4, 8)):
            c_out = width * mult
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(_BasicBlock(c_in, c_out, stride))
                c_in = c_out
        self.stages = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.stages(self.stem(x))).flatten(1))


class AlexNetish(nn.Module):
    """Five convs then two wide FC layers; width=64, fc_width=2048 gives about 10M parameters."""

    def __init__(self, width: int = 16, fc_width: int = 256, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        _positive("AlexNetish", width=width, fc_width=fc_width, num_classes=num_classes, in_channels=in_channels)
        relu = nn.ReLU
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 5, 1, 2), relu(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, 1, 1), relu(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, 1, 1), relu(inplace=True),
            nn.Conv2d(4 * width, 4 * width, 3, 1, 1), relu(inplace=True),
            nn.Conv2d(4 * width, 2 * width, 3, 1, 1), relu(inplace=True),
            nn.AdaptiveMaxPool2d(4),
        )
        self.classifier = nn.Sequential(
            nn.Linear(2 * width * 16, fc_width), relu(inplace=True),
            nn.Linear(fc_width, fc_width), relu(inplace=True),
            nn.Linear(fc_width, num_classes),
        )
        # Without BN, PyTorch's default init shrinks the signal through five convs and the
        # net barely trains; He init keeps activations at unit scale.
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(1))


class VGGish(nn.Module):
    """VGG-11-style stacks (64-128-256x2-512x2 at width=64, about 4.8M parameters; width=90 about 9.5M)."""

    def __init__(self, width: int = 16, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        _positive("VGGish", width=width, num_classes=num_classes, in_channels=in_channels)
        plan: list[int | str] = [width, "M", 2 * width, "M", 4 * width, 4 * width, "M", 8 * width, 8 * width, "M"]
        layers: list[nn.Module] = []
        c_in = in_channels
        for item in plan:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                assert isinstance(item, int)
                layers += [nn.Conv2d(c_in, item, 3, 1, 1, bias=False), nn.BatchNorm2d(item), nn.ReLU(inplace=True)]
                c_in = item
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Sequential(nn.Linear(c_in, c_in), nn.ReLU(inplace=True), nn.Linear(c_in, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(1))


class MLP(nn.Module):
    """Two hidden layers on feature vectors."""

    def __init__(self, in_features: int = 32, hidden: int = 64, num_classes: int = 4) -> None:
        super().__init__()
        _positive("MLP", in_features=in_features, hidden=hidden, num_classes=num_classes)
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
